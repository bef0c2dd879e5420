//! `metal-ipam-host`: run a Spin manifest like `spin up`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use metal_ipam_host::variables::VariableSource;
use metal_ipam_host::{HostBuilder, KvBackend, RedisSwap};

const USAGE: &str = "\
metal-ipam-host: run a Spin manifest (spin.toml v2) like `spin up`, on wasmtime

USAGE:
    metal-ipam-host up [OPTIONS]

OPTIONS:
    -f, --from <PATH>               Manifest to run [default: spin.toml]
        --listen <ADDR>             Address to listen on [default: 127.0.0.1:3000]
        --build                     Run the manifest's build commands first
        --variable <NAME=VALUE>     Set an application variable (repeatable);
                                    VALUE `@file` reads the value from a file
        --kv-file <PATH>            SQLite file of the default key-value store
                                    [default: <manifest dir>/.spin/sqlite_key_value.db]
        --kv-memory                 Keep the default key-value store in memory
        --runtime-config-file <PATH>
                                    Runtime config ([key_value_store.<label>] only,
                                    type \"spin\" or \"redis\")
        --redis-swap <MODE>         How Redis stores report compare-and-swap:
                                    spin-3.6 (default; exactly Spin 3.6: every
                                    swap reports cas-failed) or exec-reply (the
                                    EXEC reply decides: every swap, applied or
                                    aborted, reports success)
    -c, --component-id <ID>         Run only this component (repeatable), like
                                    Spin's selective deployment
    -h, --help                      Print this help

Application variables also come from SPIN_VARIABLE_<NAME> environment
variables (--variable wins). Responses carry x-kv-ops / x-kv-ops-detail
headers (a test-host addition). Ctrl-C or SIGTERM shuts down gracefully.
";

struct UpArgs {
    from: PathBuf,
    listen: SocketAddr,
    build: bool,
    variables: Vec<(String, String)>,
    kv: Option<KvBackend>,
    runtime_config: Option<PathBuf>,
    redis_swap: Option<RedisSwap>,
    components: Vec<String>,
}

fn parse_args(args: &[String]) -> anyhow::Result<Option<UpArgs>> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("up") => {}
        Some("-h" | "--help" | "help") | None => return Ok(None),
        Some(other) => bail!("unknown command {other:?} (expected `up`)\n\n{USAGE}"),
    }
    let mut up = UpArgs {
        from: PathBuf::from("spin.toml"),
        listen: "127.0.0.1:3000".parse()?,
        build: false,
        variables: Vec::new(),
        kv: None,
        runtime_config: None,
        redis_swap: None,
        components: Vec::new(),
    };
    let mut kv_flags = 0;
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> anyhow::Result<String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value")),
            }
        };
        match flag {
            "-f" | "--from" | "--file" => up.from = PathBuf::from(value(flag)?),
            "--listen" => {
                let v = value(flag)?;
                up.listen = v
                    .parse()
                    .with_context(|| format!("invalid --listen address {v:?}"))?;
            }
            "--build" => up.build = true,
            "--variable" => {
                let v = value(flag)?;
                let (name, val) = v
                    .split_once('=')
                    .with_context(|| format!("--variable {v:?} must be NAME=VALUE"))?;
                let val = match val.strip_prefix('@') {
                    Some(file) => std::fs::read_to_string(file).with_context(|| {
                        format!("cannot read value of variable {name:?} from {file}")
                    })?,
                    None => val.to_string(),
                };
                up.variables.push((name.to_string(), val));
            }
            "--kv-file" => {
                kv_flags += 1;
                up.kv = Some(KvBackend::SqliteFile(PathBuf::from(value(flag)?)));
            }
            "--kv-memory" => {
                kv_flags += 1;
                up.kv = Some(KvBackend::Memory);
            }
            "--runtime-config-file" => up.runtime_config = Some(PathBuf::from(value(flag)?)),
            "--redis-swap" => {
                let v = value(flag)?;
                up.redis_swap = Some(RedisSwap::from_name(&v).with_context(|| {
                    format!("invalid --redis-swap {v:?} (expected spin-3.6 or exec-reply)")
                })?);
            }
            "-c" | "--component-id" => up.components.push(value(flag)?),
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    if kv_flags > 1 {
        bail!("--kv-file and --kv-memory are mutually exclusive (and may be given once)");
    }
    Ok(Some(up))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let up = match parse_args(&args) {
        Ok(Some(up)) => up,
        Ok(None) => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(up)) {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(up: UpArgs) -> anyhow::Result<()> {
    if up.build {
        let manifest = metal_ipam_host::manifest::AppManifest::from_file(&up.from)?;
        metal_ipam_host::build::run_build_commands(&manifest)?;
    }
    let mut builder = HostBuilder::new(&up.from);
    if let Some(kv) = up.kv {
        builder = builder.kv(kv);
    }
    for (name, value) in up.variables {
        builder = builder.variable(name, value);
    }
    if let Some(rc) = up.runtime_config {
        builder = builder.runtime_config_file(rc);
    }
    if let Some(mode) = up.redis_swap {
        builder = builder.redis_swap(mode);
    }
    if !up.components.is_empty() {
        builder = builder.retain_components(up.components);
    }
    let host = builder.build()?;

    for label in host.kv_stores().labels() {
        if let Some(backend) = host.kv_stores().backend(label) {
            if label == "default" {
                println!("Storing default key-value data to {backend}.");
            } else {
                println!("Storing key-value data of store {label:?} to {backend}.");
            }
        }
    }
    for (name, var) in host.variables().iter() {
        let source = match var.source {
            VariableSource::Explicit => "--variable",
            VariableSource::Environment => "environment",
            VariableSource::Default => "default",
        };
        println!("Variable {name} = {} ({source})", var.display_value());
    }

    let server = host.serve(up.listen).await?;
    let base = server.base_url();
    println!("\nServing {base}");
    println!("Available Routes:");
    for route in host.router().routes() {
        println!(
            "  {}: {base}{}",
            route.component_id(),
            route.display_route()
        );
        if let Some(desc) = host
            .manifest()
            .component(route.component_id())
            .map(|c| &c.description)
        {
            if !desc.is_empty() {
                println!("    {desc}");
            }
        }
    }

    wait_for_signal().await?;
    eprintln!(
        "Shutting down (waiting up to {:?} for in-flight requests)...",
        metal_ipam_host::SHUTDOWN_GRACE
    );
    server.shutdown().await
}

#[cfg(unix)]
async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("cannot wait for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> anyhow::Result<()> {
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")
}
