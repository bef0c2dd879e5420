//! Real Spin for the tests: `spin up` of the repository's own `spin.toml`
//! and `.wasm` files, or of the app as pushed to an OCI registry
//! ([`AppSource`], [`SpinBin::registry_push`]), with the Spin CLI named by
//! [`SPIN_BIN_ENV`] (`SPIN_BIN`), on Spin's SQLite key-value store or its
//! Redis one.
//!
//! This module owns starting and stopping a Spin process, running the Spin
//! CLI's other commands the tests need, and talking to a server over
//! loopback HTTP; [`crate::harness::App`] puts it behind the same interface
//! as the in-process test host, so one test body runs on both.
//!
//! - The process gets a temporary directory of its own: the runtime config
//!   (`[key_value_store.default]` of type `spin` with a file in that
//!   directory, or type `redis` with a URL; `[[client_tls]]` blocks when the
//!   test talks to a real API server), Spin's state directory (its
//!   component logs under `logs/`) and Spin's own output (`spin.log`).
//! - Application variables go in as `SPIN_VARIABLE_<NAME>`, as SpinKube
//!   passes them; nothing else from the test's environment reaches Spin but
//!   `PATH`, `HOME` and the temp and cache directories (so a developer's own
//!   `SPIN_VARIABLE_*` cannot leak in).
//! - `spin up` serves from a child process (`spin trigger http`) that a
//!   killed `spin up` leaves behind, so both run in a process group of
//!   their own and dropping a [`SpinApp`] kills the group.
//! - Starts are serialised within a test process: the first one compiles
//!   every component (about 10 s on two cores) into wasmtime's cache, and
//!   the later ones load from it in well under a second.
//! - Requests go over loopback one connection each, the way curl sends
//!   them (see [`SpinApp::send`]). Spin reports no key-value operation
//!   counts: those are a test-host header.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;

use crate::harness::{free_port, tail, TempDir, TOKEN};
use crate::schema::repo_root;

/// The environment variable naming a Spin CLI (`spin` 3.x or 4.x).
pub const SPIN_BIN_ENV: &str = "SPIN_BIN";

/// How long a request to Spin may take before the test fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long `spin up` may take to serve (the first start compiles every
/// component).
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// How long `spin registry push` may take (the app is some 12 MB, pushed
/// over loopback).
const PUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// The Spin CLI the tests were given.
#[derive(Debug, Clone)]
pub struct SpinBin {
    /// Its path.
    pub path: PathBuf,
    /// What `spin --version` printed, e.g. `spin 3.6.3 (…)`.
    pub version: String,
}

impl SpinBin {
    /// The Spin CLI named by `SPIN_BIN`, or `None` when it is unset.
    ///
    /// # Panics
    /// When `SPIN_BIN` is set but does not run: a test run that was given a
    /// runtime must not pass without it.
    pub fn from_env() -> Option<&'static SpinBin> {
        static BIN: OnceLock<Option<SpinBin>> = OnceLock::new();
        BIN.get_or_init(|| {
            let path = std::env::var_os(SPIN_BIN_ENV).filter(|p| !p.is_empty())?;
            let path = PathBuf::from(path);
            let out = Command::new(&path)
                .arg("--version")
                .output()
                .unwrap_or_else(|e| panic!("{SPIN_BIN_ENV}={}: {e}", path.display()));
            assert!(
                out.status.success(),
                "{SPIN_BIN_ENV}={} --version failed: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Some(SpinBin { path, version })
        })
        .as_ref()
    }

    /// The version number alone (`3.6.3`), from [`SpinBin::version`].
    pub fn number(&self) -> &str {
        self.version.split_whitespace().nth(1).unwrap_or("?")
    }

    /// `spin registry push` of `manifest` (its `.wasm` files as they are:
    /// no `--build`, and `SPIN_ALWAYS_BUILD` cannot reach it) to
    /// `reference` (`host:port/repository:tag`); `insecure` adds
    /// `--insecure`, which in Spin 3.x and 4.x also means plain HTTP.
    /// Spin's registry cache goes to `cache_dir`, its output to
    /// `cache_dir/push.log`. Answers the manifest digest Spin reports
    /// (`sha256:…`).
    ///
    /// # Errors
    /// If the push fails, takes longer than 120 s or reports no digest; the
    /// error carries Spin's output.
    pub fn registry_push(
        &self,
        manifest: &Path,
        reference: &str,
        insecure: bool,
        cache_dir: &Path,
    ) -> Result<String> {
        std::fs::create_dir_all(cache_dir).context("registry cache dir")?;
        let log = cache_dir.join("push.log");
        let mut cmd = Command::new(&self.path);
        cmd.args(["registry", "push", "--from"])
            .arg(manifest)
            .arg("--cache-dir")
            .arg(cache_dir);
        if insecure {
            cmd.arg("--insecure");
        }
        cmd.arg(reference);
        clean_env(&mut cmd);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let out = std::fs::File::create(&log).context("push.log")?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", self.path.display()))?;
        let deadline = Instant::now() + PUSH_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                kill_group(&mut child);
                bail!(
                    "{} registry push {reference}: not done in {} s:\n{}",
                    self.version,
                    PUSH_TIMEOUT.as_secs(),
                    tail(&log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        if !status.success() {
            bail!(
                "{} registry push {reference}: {status}:\n{output}",
                self.version
            );
        }
        // "Pushed with digest sha256:…" (3.6 and 4.0 alike).
        output
            .split_whitespace()
            .find(|w| w.starts_with("sha256:"))
            .map(str::to_string)
            .with_context(|| format!("{} registry push named no digest:\n{output}", self.version))
    }
}

/// What `spin up --from` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppSource {
    /// A `spin.toml` on disk (with its `.wasm` files where it names them).
    Manifest(PathBuf),
    /// An app pushed to an OCI registry: `reference` is
    /// `host[:port]/repository:tag` or `…@sha256:…`; `insecure` adds
    /// `--insecure` (plain HTTP or an untrusted certificate). Spin pulls it
    /// into a registry cache in the process's directory, so nothing comes
    /// from an earlier pull.
    Registry {
        /// The reference.
        reference: String,
        /// Whether to pass `--insecure`.
        insecure: bool,
    },
}

impl AppSource {
    /// The repository's own `spin.toml`.
    pub fn repo() -> AppSource {
        AppSource::Manifest(repo_root().join("spin.toml"))
    }
}

/// The key-value store a Spin process is given as `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpinStore {
    /// Spin's SQLite backend (`type = "spin"`) on a file.
    Sqlite(PathBuf),
    /// Spin's Redis backend (`type = "redis"`) on this URL (with its
    /// database number).
    Redis(String),
}

/// A `[[client_tls]]` block of the runtime config: the CA that Spin's
/// outbound HTTP trusts for some hosts of some components (Spin trusts only
/// the web PKI roots otherwise).
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The components it applies to.
    pub component_ids: Vec<String>,
    /// Host names or addresses, without ports (Spin 3.6 refuses a port).
    pub hosts: Vec<String>,
    /// A PEM file of CA certificates.
    pub ca_roots_file: PathBuf,
}

/// The runtime config for `store` and `tls`, as `spin up
/// --runtime-config-file` reads it.
pub fn runtime_config(store: &SpinStore, tls: &[ClientTls]) -> String {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut out = String::from("[key_value_store.default]\n");
    match store {
        SpinStore::Sqlite(path) => {
            out.push_str("type = \"spin\"\n");
            out.push_str(&format!("path = {}\n", q(&path.to_string_lossy())));
        }
        SpinStore::Redis(url) => {
            out.push_str("type = \"redis\"\n");
            out.push_str(&format!("url = {}\n", q(url)));
        }
    }
    for t in tls {
        let list = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|s| q(s)).collect();
            format!("[{}]", items.join(", "))
        };
        out.push_str("\n[[client_tls]]\n");
        out.push_str(&format!("component_ids = {}\n", list(&t.component_ids)));
        out.push_str(&format!("hosts = {}\n", list(&t.hosts)));
        out.push_str(&format!(
            "ca_roots_file = {}\n",
            q(&t.ca_roots_file.to_string_lossy())
        ));
    }
    out
}

/// A running `spin up` of the repository's `spin.toml` (or of another
/// [`AppSource`]); dropping it stops the process.
pub struct SpinApp {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    /// Its store.
    pub store: SpinStore,
    dir: TempDir,
}

impl std::fmt::Debug for SpinApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinApp")
            .field("base_url", &self.base_url)
            .field("store", &self.store)
            .finish()
    }
}

/// A response from Spin.
#[derive(Debug)]
pub struct SpinResponse {
    /// Status and headers.
    pub parts: http::response::Parts,
    /// The whole body.
    pub body: Bytes,
}

impl SpinApp {
    /// Starts `bin` on `spin.toml` with `api_token` = [`TOKEN`] and `vars`
    /// (application variables by name), the default store `store` and the
    /// `[[client_tls]]` blocks `tls`; waits until `/healthz` answers.
    ///
    /// `dir` becomes the process's directory (runtime config, state, log)
    /// and is removed when the app is dropped.
    ///
    /// # Errors
    /// If Spin exits during startup or does not serve within 300 s; the
    /// error carries the end of its output.
    pub async fn start(
        bin: &SpinBin,
        dir: TempDir,
        store: SpinStore,
        vars: &[(&str, &str)],
        tls: &[ClientTls],
    ) -> Result<SpinApp> {
        crate::harness::require_wasm();
        Self::start_from(bin, &AppSource::repo(), dir, store, vars, tls).await
    }

    /// [`SpinApp::start`] of `source`: the repository's `spin.toml`, another
    /// manifest, or an app in an OCI registry (pulled into
    /// `dir/registry-cache`, see [`SpinApp::registry_cache`]).
    ///
    /// # Errors
    /// As [`SpinApp::start`] (a failed pull is Spin exiting during
    /// startup).
    pub async fn start_from(
        bin: &SpinBin,
        source: &AppSource,
        dir: TempDir,
        store: SpinStore,
        vars: &[(&str, &str)],
        tls: &[ClientTls],
    ) -> Result<SpinApp> {
        let rc = dir.path().join("runtime-config.toml");
        std::fs::write(&rc, runtime_config(&store, tls)).context("runtime config")?;
        let log = dir.path().join("spin.log");
        // One start at a time: the first compiles every component.
        static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one = STARTING.lock().await;
        // The port is free when picked but not reserved: if something else
        // takes it before Spin binds it, Spin exits and we pick another.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            let base_url = format!("http://127.0.0.1:{port}");
            let mut child = spawn(bin, source, dir.path(), &rc, &log, port, vars)?;
            match wait_until_serving(&base_url, &mut child).await {
                Ok(()) => {
                    return Ok(SpinApp {
                        child,
                        base_url,
                        store,
                        dir,
                    })
                }
                Err(why) => {
                    kill_group(&mut child);
                    let out = tail(&log, 30);
                    if attempt < 3 && out.to_ascii_lowercase().contains("address already in use") {
                        continue;
                    }
                    bail!("{} {why}:\n{out}", bin.version);
                }
            }
        }
    }

    /// Where Spin put what it pulled of an [`AppSource::Registry`] app
    /// (`registry/manifests/…`, `registry/wasm/sha256:…`).
    pub fn registry_cache(&self) -> PathBuf {
        self.dir.path().join("registry-cache")
    }

    /// The process group of `spin up` and the processes it started.
    pub fn process_group(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of Spin's own output and of every component's log,
    /// for failure messages.
    pub fn log_tail(&self) -> String {
        let mut out = tail(&self.dir.path().join("spin.log"), 30);
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("state/logs")) {
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                let t = tail(&f, 5);
                if !t.trim().is_empty() {
                    out.push_str(&format!(
                        "--- {}\n{t}",
                        f.file_name().unwrap_or_default().to_string_lossy()
                    ));
                }
            }
        }
        out
    }

    /// Sends `req` (its URI a path such as `/v1/pools`) to Spin, as
    /// `exchange` does: with its `content-length` if it has one, else a
    /// non-empty body goes chunked, as a client streaming its body sends it.
    ///
    /// # Errors
    /// Connection failures and timeouts (with the end of Spin's output).
    pub async fn send(&self, req: http::Request<Vec<u8>>) -> Result<SpinResponse> {
        let (parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let what = format!("{} {path}", parts.method);
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            exchange(&self.base_url, &parts, &path, body),
        )
        .await
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => bail!("{what} to Spin: {e:#}\n{}", self.log_tail()),
            Err(_) => bail!(
                "{what} to Spin: no answer in {} s\n{}",
                REQUEST_TIMEOUT.as_secs(),
                self.log_tail()
            ),
        }
    }
}

impl Drop for SpinApp {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// Kills `spin up` and its `spin trigger` child: the whole process group
/// `spawn` gave them (SIGTERM does not stop `spin up`, and SIGKILL to it
/// alone leaves the trigger process serving).
pub(crate) fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group
        // whose id is that pid: the group `spawn` made for this child.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Clears `cmd`'s environment but for what Spin itself needs (`PATH`,
/// `HOME`, the temp and cache directories): no `SPIN_VARIABLE_*` or
/// `SPIN_ALWAYS_BUILD` of the developer's reaches it.
fn clean_env(cmd: &mut Command) {
    cmd.env_clear();
    for keep in ["PATH", "HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_DATA_HOME"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
}

/// Starts `spin up` of `source` on `port` in `dir`, its output to `log`,
/// with only the variables given (and a few variables of the environment
/// Spin itself needs).
fn spawn(
    bin: &SpinBin,
    source: &AppSource,
    dir: &Path,
    rc: &Path,
    log: &Path,
    port: u16,
    vars: &[(&str, &str)],
) -> Result<Child> {
    let mut cmd = Command::new(&bin.path);
    cmd.arg("up").arg("--from");
    match source {
        AppSource::Manifest(path) => {
            cmd.arg(path);
        }
        AppSource::Registry {
            reference,
            insecure,
        } => {
            cmd.arg(reference)
                .arg("--cache-dir")
                .arg(dir.join("registry-cache"));
            if *insecure {
                cmd.arg("--insecure");
            }
        }
    }
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--runtime-config-file")
        .arg(rc)
        .arg("--state-dir")
        .arg(dir.join("state"));
    clean_env(&mut cmd);
    cmd.env("SPIN_VARIABLE_API_TOKEN", TOKEN);
    for (k, v) in vars {
        cmd.env(format!("SPIN_VARIABLE_{}", k.to_ascii_uppercase()), v);
    }
    // `spin up` runs the app in a child process (`spin trigger http`) that
    // outlives a killed parent: a process group of their own lets
    // [`SpinApp`]'s drop kill both.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let out = std::fs::File::create(log).context("spin.log")?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", bin.path.display()))
}

/// Waits until `GET /healthz` answers 200, or says why not: the process
/// exited, or [`START_TIMEOUT`] passed.
async fn wait_until_serving(base_url: &str, child: &mut Child) -> std::result::Result<(), String> {
    wait_until_ok(base_url, "/healthz", child, START_TIMEOUT).await
}

/// Waits until `GET <base_url><path>` answers 200 (each probe bounded to
/// 5 s, one every 50 ms), or says why not: `child` exited, or `within`
/// passed. Shared by every test that starts a server process.
pub(crate) async fn wait_until_ok(
    base_url: &str,
    path: &str,
    child: &mut Child,
    within: Duration,
) -> std::result::Result<(), String> {
    let deadline = Instant::now() + within;
    let (probe_head, ()) = http::Request::get(path)
        .body(())
        .map_err(|e| e.to_string())?
        .into_parts();
    loop {
        let probe = exchange(base_url, &probe_head, path, Vec::new());
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), probe).await {
            if r.parts.status == 200 {
                return Ok(());
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => return Err(format!("exited during startup ({status})")),
            Err(e) => return Err(format!("cannot be waited for: {e}")),
            Ok(None) => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "did not answer GET {path} on {base_url} within {} s",
                within.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request on a connection of its own, the way curl sends it: the
/// head, then the body (as is with its `content-length`, else chunked if
/// there is one) while reading the answer, and no more sending once the
/// answer has arrived. A server that refuses a large body before reading it
/// answers and closes; hyper's client keeps writing and reports the reset
/// instead of the answer, curl (and this) report the answer.
pub(crate) async fn exchange(
    base_url: &str,
    parts: &http::request::Parts,
    path: &str,
    body: Vec<u8>,
) -> Result<SpinResponse> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base_url.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut rd, mut wr) = stream.into_split();
    let sized = parts.headers.contains_key(http::header::CONTENT_LENGTH) || body.is_empty();
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n",
        parts.method
    );
    for (k, v) in &parts.headers {
        head.push_str(&format!("{k}: {}\r\n", v.to_str()?));
    }
    if !sized {
        head.push_str("transfer-encoding: chunked\r\n");
    }
    head.push_str("\r\n");
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        for chunk in body.chunks(64 * 1024) {
            if sized {
                wr.write_all(chunk).await?;
            } else {
                wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                wr.write_all(chunk).await?;
                wr.write_all(b"\r\n").await?;
            }
        }
        if !sized {
            wr.write_all(b"0\r\n\r\n").await?;
        }
        wr.flush().await?;
        // Hand the write half back instead of dropping it: dropping sends
        // FIN, and Spin's server (hyper, no half-close) takes a half-closed
        // connection for a client that went away.
        Ok::<_, std::io::Error>(wr)
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let answer = loop {
        if let Some(answer) = parse_response(&buf)? {
            break answer;
        }
        match rd.read(&mut chunk).await {
            Ok(0) => bail!(
                "the connection closed before a whole answer ({} bytes: {:?})",
                buf.len(),
                String::from_utf8_lossy(&buf[..buf.len().min(200)])
            ),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => bail!("reading the answer after {} bytes: {e}", buf.len()),
        }
    };
    writer.abort();
    let _ = writer.await;
    Ok(answer)
}

/// A whole HTTP/1.1 response in `buf` (`content-length` or chunked body),
/// or `None` while it is incomplete.
fn parse_response(buf: &[u8]) -> Result<Option<SpinResponse>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(at) = resp.parse(buf)? else {
        return Ok(None);
    };
    let mut b = http::Response::builder().status(resp.code.unwrap_or(0));
    let mut length = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = Some(std::str::from_utf8(h.value)?.trim().parse::<usize>()?);
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = String::from_utf8_lossy(h.value).contains("chunked");
        }
        b = b.header(h.name, h.value);
    }
    let rest = &buf[at..];
    let body = if chunked {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            match httparse::parse_chunk_size(&rest[pos..])
                .map_err(|_| anyhow::anyhow!("bad chunk"))?
            {
                httparse::Status::Partial => return Ok(None),
                httparse::Status::Complete((skip, 0)) => {
                    let _ = skip;
                    break out;
                }
                httparse::Status::Complete((skip, size)) => {
                    let start = pos + skip;
                    let end = start + size as usize;
                    if rest.len() < end + 2 {
                        return Ok(None);
                    }
                    out.extend_from_slice(&rest[start..end]);
                    pos = end + 2;
                }
            }
        }
    } else {
        let n = length.unwrap_or(0);
        if rest.len() < n {
            return Ok(None);
        }
        rest[..n].to_vec()
    };
    let (parts, ()) = b.body(())?.into_parts();
    Ok(Some(SpinResponse {
        parts,
        body: Bytes::from(body),
    }))
}

/// How many live (not zombie) processes are in process group `group`, from
/// `/proc` (Linux).
pub fn processes_in_group(group: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid pgrp …; comm may hold spaces.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first() != Some(&"Z") && fields.get(2) == Some(&group.to_string().as_str())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_config_names_the_store_and_the_ca() {
        let rc = runtime_config(
            &SpinStore::Redis("redis://127.0.0.1:6399/17".into()),
            &[ClientTls {
                component_ids: vec!["pools".into(), "allocate".into()],
                hosts: vec!["127.0.0.1".into()],
                ca_roots_file: "/tmp/ca \"x\".pem".into(),
            }],
        );
        let parsed: toml::Table = toml::from_str(&rc).expect("valid TOML");
        assert_eq!(
            parsed["key_value_store"]["default"]["url"].as_str(),
            Some("redis://127.0.0.1:6399/17")
        );
        let tls = parsed["client_tls"].as_array().unwrap();
        assert_eq!(tls[0]["component_ids"].as_array().unwrap().len(), 2);
        assert_eq!(tls[0]["ca_roots_file"].as_str(), Some("/tmp/ca \"x\".pem"));
        let rc = runtime_config(&SpinStore::Sqlite("/tmp/kv.db".into()), &[]);
        let parsed: toml::Table = toml::from_str(&rc).unwrap();
        assert_eq!(
            parsed["key_value_store"]["default"]["type"].as_str(),
            Some("spin")
        );
        assert!(parsed.get("client_tls").is_none());
    }
}
