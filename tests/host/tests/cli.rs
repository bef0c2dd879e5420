//! The `metal-ipam-host` binary: startup errors, `--build`, graceful
//! shutdown, and two host processes sharing one SQLite file.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{kv_uri, write_probe_manifest, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_metal-ipam-host");

fn command() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("SPIN_VARIABLE_") {
            c.env_remove(k);
        }
    }
    c
}

/// A running `metal-ipam-host up`, killed (SIGTERM) on drop.
struct Running {
    child: Child,
    addr: SocketAddr,
    stdout: Vec<String>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = command()
            .arg("up")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn metal-ipam-host");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    let found = line
                        .strip_prefix("Serving http://")
                        .map(|a| a.trim().parse::<SocketAddr>());
                    lines.push(line);
                    if let Some(parsed) = found {
                        break parsed.expect("listen address");
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("metal-ipam-host did not start; stdout so far: {lines:#?}");
                }
            }
        };
        // Collect the route list printed after the address.
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            lines.push(line);
        }
        Running {
            child,
            addr,
            stdout: lines,
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("metal-ipam-host did not stop after SIGTERM");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn missing_required_variable_fails_at_startup_naming_it() {
    let out = command()
        .args(["up", "--kv-memory", "--from"])
        .arg(common::workspace_root().join("spin.toml"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("api_token") && stderr.contains("SPIN_VARIABLE_API_TOKEN"),
        "{stderr}"
    );
}

#[test]
fn bad_arguments_are_rejected() {
    let out = command()
        .args(["up", "--kv-memory", "--kv-file", "x.db"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = command().args(["up", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = command()
        .args(["up", "--redis-swap", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spin-3.6 or exec-reply"));
    let out = command().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--kv-file") && help.contains("--redis-swap"));
}

#[test]
fn build_runs_each_distinct_command_once_in_the_right_directory() {
    let dir = TempDir::new("cli-build");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let wasm = common::probe_wasm();
    std::fs::write(
        dir.join("spin.toml"),
        format!(
            r#"spin_manifest_version = 2
[application]
name = "b"
[[trigger.http]]
route = "/a/..."
component = "a"
[[trigger.http]]
route = "/b/..."
component = "b"
[component.a]
source = "{w}"
[component.a.build]
command = "echo a >> build.log"
[component.b]
source = "{w}"
[component.b.build]
command = ["echo a >> build.log", "echo sub >> ../build.log"]
workdir = "sub"
"#,
            w = wasm.display()
        ),
    )
    .unwrap();
    let mut running = Running::start(&[
        "--build",
        "--kv-memory",
        "--from",
        dir.join("spin.toml").to_str().unwrap(),
    ]);
    let log = std::fs::read_to_string(dir.join("build.log")).unwrap();
    // "echo a" runs in the manifest dir and in sub/ (different workdirs);
    // sub/'s copy went to sub/build.log.
    assert_eq!(log, "a\nsub\n");
    assert_eq!(
        std::fs::read_to_string(dir.join("sub/build.log")).unwrap(),
        "a\n"
    );
    assert!(
        running
            .stdout
            .iter()
            .any(|l| l.contains("a: http://") && l.ends_with("/a (wildcard)")),
        "{:#?}",
        running.stdout
    );
    assert!(running.terminate().success());

    // A failing build command stops startup.
    std::fs::write(dir.join("fail.toml"), "spin_manifest_version = 2\n[application]\nname = \"f\"\n[[trigger.http]]\nroute = \"/\"\ncomponent = \"f\"\n[component.f]\nsource = \"f.wasm\"\n[component.f.build]\ncommand = \"exit 3\"\n").unwrap();
    let out = command()
        .args(["up", "--build", "--from"])
        .arg(dir.join("fail.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exit 3"));
}

async fn get(addr: SocketAddr, uri: &str) -> (u16, http::HeaderMap, serde_json::Value) {
    let (status, headers, body) = common::http_get(addr, uri).await;
    let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, headers, v)
}

/// Two host processes on one SQLite file: increments and CAS swaps from
/// both never lose an update, and each response reports its KV ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_share_one_sqlite_file() {
    let dir = TempDir::new("cli-shared");
    let manifest = write_probe_manifest(dir.path(), "127.0.0.1:9");
    let db = dir.join("shared/kv.db");
    let rc = dir.join("runtime-config.toml");
    let args = [
        "--from",
        manifest.to_str().unwrap(),
        "--kv-file",
        db.to_str().unwrap(),
        "--runtime-config-file",
        rc.to_str().unwrap(),
        "--variable",
        "secret_token=x",
    ];
    let mut a = Running::start(&args);
    let mut b = Running::start(&args);
    assert!(
        a.stdout
            .iter()
            .any(|l| l.contains("Storing default key-value data to")),
        "{:#?}",
        a.stdout
    );
    assert!(
        a.stdout
            .iter()
            .any(|l| l == "Variable secret_token = <secret> (--variable)"),
        "{:#?}",
        a.stdout
    );

    const PER_TASK: usize = 25;
    let mut tasks = Vec::new();
    for addr in [a.addr, b.addr, a.addr, b.addr] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..PER_TASK {
                let (status, headers, _) =
                    get(addr, &kv_uri(&["open:wasi:default", "incr:counter:1"])).await;
                assert_eq!(status, 200);
                assert_eq!(headers["x-kv-ops-detail"], "increment=1");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, _, v) = get(a.addr, &kv_uri(&["open:wasi:default", "incr:counter:0"])).await;
    assert_eq!(v[1]["ok"], serde_json::json!(4 * PER_TASK));

    // Data written by one process is read by the other (nothing cached).
    get(a.addr, &kv_uri(&["open:spin:default", "set:from-a:1"])).await;
    let (_, _, v) = get(b.addr, &kv_uri(&["open:spin:default", "get:from-a"])).await;
    assert_eq!(v[1]["ok"]["utf8"], "1");

    assert!(a.terminate().success(), "graceful exit on SIGTERM");
    assert!(b.terminate().success());

    // Spin's table in the file.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let n: Vec<u8> = conn
        .query_row(
            "SELECT value FROM spin_key_value WHERE store='default' AND key='counter'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, (4 * PER_TASK as i64).to_le_bytes().to_vec());
}
