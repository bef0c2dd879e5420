//! The metrics as Prometheus sees them: Debian's `prometheus` package, the
//! real thing.
//!
//! - `promtool check rules` and `promtool test rules` on the example alert
//!   rules in `deploy/monitoring/` (their unit tests fire each alert on
//!   made-up series);
//! - a real Prometheus, started here, scrapes the running app with the
//!   read token as a bearer token (from a file, as a Secret would give it)
//!   — the test host (`metal-ipam-host up`) and, when `SPIN_BIN` is set,
//!   real `spin up` on its SQLite and Redis stores — with the alert rules
//!   loaded; the test then asks Prometheus's HTTP API for the values and
//!   compares them with what it did through the plain HTTP API.
//!
//! Without the binaries the tests print a note and pass, except under CI
//! (`CI` set), where they fail: `.ci/run` installs the package.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metal_ipam_tests::client::HttpClient;
use metal_ipam_tests::harness::{
    claim_json, free_port, pool_json, App, HostProcess, Runtime, TempDir,
};
use serde_json::Value;

const READ: &str = "prometheus-read-token-7d2a";

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// The binary `name`, or `None` (with a note) when it is not installed
/// outside CI.
fn binary(name: &str) -> Option<&'static str> {
    let path: &'static str = match name {
        "promtool" => "/usr/bin/promtool",
        _ => "/usr/bin/prometheus",
    };
    if Path::new(path).exists() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{path} is required in CI (Debian package prometheus)");
    }
    eprintln!("note: {path} not installed (Debian package prometheus): skipped");
    None
}

#[test]
fn the_alert_rules_are_valid_and_fire_as_their_tests_say() {
    let Some(promtool) = binary("promtool") else {
        return;
    };
    let dir = rules_dir();
    for args in [
        ["check", "rules", "prometheus-rules.yaml"],
        ["test", "rules", "prometheus-rules.test.yaml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A Prometheus server scraping one target; killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`) every second at
    /// `/v1/metrics` with `token` as a bearer token, with the example alert
    /// rules; waits until it is ready.
    async fn start(bin: &str, target: &str, token: &str) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: metal-ipam\n    metrics_path: /v1/metrics\n    \
             authorization:\n      type: Bearer\n      credentials_file: {token}\n    \
             static_configs:\n      - targets: ['{target}']\n",
            rules = rules_dir().join("prometheus-rules.yaml").display(),
            token = token_file.display(),
        );
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let port = free_port().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", p.url);
        let client = HttpClient::new();
        p.until("Prometheus ready", || async {
            matches!(client.call("GET", &ready, None).await, Ok(r) if r.status == 200).then_some(())
        })
        .await;
        p
    }

    /// Polls `f` until it answers `Some`, for at most 60 s (Prometheus
    /// scrapes every second; this waits on its answer, not on a clock).
    async fn until<T, F, Fut>(&self, what: &str, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(x) = f().await {
                return x;
            }
            let log = self._dir.path().join("prometheus.log");
            assert!(
                Instant::now() < deadline,
                "{what}: not within 60 s; Prometheus log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of the one series `query` returns, if it returns one.
    async fn value(&self, query: &str) -> Option<f64> {
        let q: String =
            percent_encoding::utf8_percent_encode(query, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        let url = format!("{}/api/v1/query?query={q}", self.url);
        let r = HttpClient::new().call("GET", &url, None).await.ok()?;
        let result = r.body["data"]["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits until `query` has the value `want`.
    async fn expect(&self, query: &str, want: f64) {
        self.until(&format!("{query} == {want}"), || async {
            (self.value(query).await == Some(want)).then_some(())
        })
        .await;
    }
}

/// What the test scrapes: the app at `base_url`, kept running.
struct Target {
    base_url: String,
    _host: Option<HostProcess>,
    _spin: Option<App>,
    /// The host's store file (after `_host`: dropped once it stopped).
    _dir: Option<TempDir>,
}

async fn target(runtime: Runtime) -> Option<Target> {
    binary("prometheus")?;
    if runtime == Runtime::Host {
        let dir = TempDir::new("prometheus-host");
        let args: Vec<std::ffi::OsString> = vec![
            "--kv-file".into(),
            dir.path().join("kv.db").into(),
            "--variable".into(),
            format!("read_token={READ}").into(),
        ];
        let host = HostProcess::start_with_args(&args).expect("metal-ipam-host up");
        return Some(Target {
            base_url: host.base_url.clone(),
            _host: Some(host),
            _spin: None,
            _dir: Some(dir),
        });
    }
    let app = App::on(runtime, &[("read_token", READ.to_string())], &[]).await?;
    Some(Target {
        base_url: app.base_url().expect("spin up listens").to_string(),
        _host: None,
        _spin: Some(app),
        _dir: None,
    })
}

/// Two pools, four allocations and one release through the plain HTTP
/// API; then Prometheus's view of the pools and counters, and of the
/// alert rules it loaded.
async fn prometheus_scrapes_the_app(t: Target) {
    let api = HttpClient::new();
    let base = &t.base_url;
    for (name, cidr) in [("web-v4", "10.80.0.0/24"), ("db-v4", "10.81.0.0/24")] {
        let r = api
            .call(
                "PUT",
                &format!("{base}/v1/pools/ns/{name}"),
                Some(&pool_json("ns", name, &[cidr], 24)),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 201, "{}", r.body);
    }
    for n in 0..4 {
        let pool = if n < 3 { "web-v4" } else { "db-v4" };
        let claim = claim_json("ns", &format!("c{n}"), &format!("uid-{n}"), pool);
        let r = api
            .call("POST", &format!("{base}/v1/claims"), Some(&claim))
            .await
            .unwrap();
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let r = api
        .call("DELETE", &format!("{base}/v1/claims/ns/c2"), None)
        .await
        .unwrap();
    assert!(r.status < 300, "{}", r.body);
    // What the store says, through the API, is what Prometheus must show.
    let pool = api
        .call("GET", &format!("{base}/v1/pools/ns/web-v4"), None)
        .await
        .unwrap();
    let used = pool.body["status"]["ipAddresses"]["used"]
        .as_f64()
        .expect("status.ipAddresses.used");

    let host_port = base.trim_start_matches("http://");
    let prom = Prometheus::start(binary("prometheus").unwrap(), host_port, READ).await;
    prom.expect(r#"up{job="metal-ipam"}"#, 1.0).await;
    prom.expect(r#"metal_ipam_pool_used{name="web-v4"}"#, used)
        .await;
    assert_eq!(used, 2.0, "3 allocated, 1 released");
    prom.expect(r#"metal_ipam_pool_used{name="db-v4"}"#, 1.0)
        .await;
    prom.expect(
        r#"metal_ipam_pool_capacity{name="web-v4",kind="MetalIPPool",family="ipv4",vrf="false"}"#,
        pool.body["status"]["ipAddresses"]["total"]
            .as_f64()
            .unwrap(),
    )
    .await;
    prom.expect("metal_ipam_allocations_total", 4.0).await;
    prom.expect("metal_ipam_releases_total", 1.0).await;
    // The example rules loaded and evaluate without error.
    let rules_url = format!("{}/api/v1/rules", prom.url);
    let rules: Vec<Value> = prom
        .until("rules evaluated", || async {
            let r = HttpClient::new().call("GET", &rules_url, None).await.ok()?;
            let rules = r.body["data"]["groups"][0]["rules"].as_array()?.clone();
            rules
                .iter()
                .all(|r| {
                    r["lastEvaluation"]
                        .as_str()
                        .is_some_and(|t| !t.starts_with("0001"))
                })
                .then_some(rules)
        })
        .await;
    assert_eq!(rules.len(), 9);
    for r in &rules {
        assert_eq!(r["health"], "ok", "{r}");
    }
}

metal_ipam_tests::on_every_runtime!(target: prometheus_scrapes_the_app);
