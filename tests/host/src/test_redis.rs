//! A Redis server for tests of the Redis backend (test support, not Spin
//! behaviour).
//!
//! [`TestRedis::get`] finds one, in this order:
//! 1. [`REDIS_URL_ENV`] (`METAL_IPAM_TEST_REDIS_URL`, e.g.
//!    `redis://127.0.0.1:6399`), which `.ci/run` exports after starting
//!    its own `redis-server`;
//! 2. otherwise a private `redis-server` from `PATH`, started on a free
//!    loopback port without persistence and killed when the handle drops;
//! 3. otherwise none: the test prints `skipped: no redis-server` (straight
//!    to stderr, so it shows without `--nocapture`) and returns — except
//!    under `CI=true`, where a missing Redis fails the test.
//!
//! Tests sharing one server stay apart by database number: each test uses
//! its own ([`TestRedis::url`]) and flushes it first ([`TestRedis::flush`]).
//! Numbers in use: `tests/host/tests/kv_semantics.rs` 1–9 and 13,
//! `tests/host/tests/probe.rs` 10, `tests/tests/concurrency.rs` 11–12 and
//! 14–15, the tests on real Spin 16 and up (`tests/src/harness.rs`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the Redis server tests use
/// (`redis://host:port`, no database number).
pub const REDIS_URL_ENV: &str = "METAL_IPAM_TEST_REDIS_URL";

/// A Redis server for one test: CI's, or a private one.
pub struct TestRedis {
    base: String,
    child: Option<Child>,
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for TestRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRedis")
            .field("base", &self.base)
            .field("private", &self.child.is_some())
            .finish()
    }
}

/// Whether this is a CI run (`CI=true`, as `.ci/run` is started).
pub fn in_ci() -> bool {
    matches!(
        std::env::var("CI")
            .map(|v| v.to_ascii_lowercase())
            .as_deref(),
        Ok("true" | "1")
    )
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

impl TestRedis {
    /// A server for the test `test` (named in messages), or `None` after
    /// printing why the test is skipped.
    ///
    /// # Panics
    /// When [`REDIS_URL_ENV`] is set but that server does not answer, when
    /// a private server does not start, and under `CI=true` when there is
    /// no Redis at all.
    pub fn get(test: &str) -> Option<TestRedis> {
        if let Some(url) = std::env::var(REDIS_URL_ENV)
            .ok()
            .filter(|u| !u.trim().is_empty())
        {
            let r = TestRedis {
                base: url.trim().to_string(),
                child: None,
                dir: None,
            };
            if let Err(e) = r.ping(Duration::from_secs(5)) {
                panic!("{REDIS_URL_ENV}={} does not answer: {e}", r.base);
            }
            return Some(r);
        }
        let Some(server) = on_path("redis-server") else {
            if in_ci() {
                panic!(
                    "{test}: CI=true but there is no Redis: {REDIS_URL_ENV} is unset and redis-server is not on PATH (.ci/run installs and starts one)"
                );
            }
            let _ = writeln!(
                std::io::stderr(),
                "skipped: no redis-server ({test}; install redis-server or set {REDIS_URL_ENV})"
            );
            return None;
        };
        Some(Self::start_private(&server).unwrap_or_else(|e| panic!("{test}: {e}")))
    }

    fn start_private(server: &Path) -> Result<TestRedis, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "metal-ipam-redis-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let child = Command::new(server)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--databases", "64"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", server.display()))?;
        let r = TestRedis {
            base: format!("redis://127.0.0.1:{port}"),
            child: Some(child),
            dir: Some(dir),
        };
        r.ping(Duration::from_secs(10))
            .map_err(|e| format!("private redis-server on port {port} did not answer: {e}"))?;
        Ok(r)
    }

    fn ping(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let attempt = redis::Client::open(self.url(0).as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut c| redis::cmd("PING").exec(&mut c));
            match attempt {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The URL of database `db` on this server (`redis://host:port/<db>`).
    pub fn url(&self, db: u8) -> String {
        match redis::parse_redis_url(&self.base) {
            Some(mut u) => {
                u.set_path(&format!("/{db}"));
                u.to_string()
            }
            None => format!("{}/{db}", self.base.trim_end_matches('/')),
        }
    }

    /// Empties database `db` (`FLUSHDB`).
    ///
    /// # Panics
    /// If the server does not answer.
    pub fn flush(&self, db: u8) {
        let url = self.url(db);
        redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .and_then(|mut c| redis::cmd("FLUSHDB").exec(&mut c))
            .unwrap_or_else(|e| panic!("FLUSHDB on {url}: {e}"));
    }

    /// The URL of database `db`, flushed.
    pub fn fresh_db(&self, db: u8) -> String {
        self.flush(db);
        self.url(db)
    }

    /// Whether this is a private server started by the test.
    pub fn is_private(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
