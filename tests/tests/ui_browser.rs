//! The browser view in a real browser: headless Chromium driven through
//! WebDriver (chromedriver) against the real components on the test host,
//! with data created through the plain HTTP API and a seeded observation
//! summary. Writes one PNG per view to `target/ui-screenshots/`.
//!
//! Skipped (with a note) when chromedriver is absent, unless `CI` is set:
//! then it fails. `CHROMEDRIVER` and `CHROMIUM` override
//! `/usr/bin/chromedriver` and `/usr/bin/chromium`.
//!
//! The WebDriver client is the dozen W3C WebDriver commands below, over the
//! hyper client this crate already builds with, rather than `fantoccini` or
//! `thirtyfour`: neither is in the offline crate cache, both bring their own
//! HTTP/TLS stacks and a few dozen crates to compile on every CI run, and
//! the protocol used here is plain JSON over loopback HTTP.
//!
//! Synchronisation is by polling the DOM for the expected element with a
//! bounded deadline ([`Browser::wait_text`]), never by sleeping for a fixed
//! time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use metal_ipam_core::observe::summary::{MachineRow, PortRow, Summary, SUMMARY_VERSION};
use metal_ipam_tests::harness::{free_port, pool_json, App, TempDir};
use metal_ipam_tests::schema::repo_root;
use serde_json::{json, Value};

const READ: &str = "browser-read-token-51d0";
const DEADLINE: Duration = Duration::from_secs(20);
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Serves `app` on a loopback port (each request handed to the test
/// host), for the browser.
async fn serve(app: Arc<App>) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let app = app.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let bytes = body.collect().await?.to_bytes().to_vec();
                            let uri = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                            let mut b = http::Request::builder()
                                .method(parts.method.clone())
                                .uri(uri);
                            for name in ["authorization", "accept", "content-type"] {
                                if let Some(v) = parts.headers.get(name) {
                                    b = b.header(name, v);
                                }
                            }
                            let r = app.send(b.body(bytes).expect("request")).await;
                            let mut resp = hyper::Response::builder().status(r.status);
                            for (k, v) in &r.headers {
                                if k != "content-length" && k != "transfer-encoding" {
                                    resp = resp.header(k, v);
                                }
                            }
                            Ok::<_, hyper::Error>(
                                resp.body(Full::new(Bytes::from(r.raw))).expect("response"),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

/// chromedriver, killed on drop.
struct Driver {
    child: Child,
    base: String,
    _profile: TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One WebDriver session.
struct Browser {
    http: Client<HttpConnector, Full<Bytes>>,
    session: String,
    base: String,
    shots: PathBuf,
}

impl Browser {
    async fn raw(
        http: &Client<HttpConnector, Full<Bytes>>,
        method: &str,
        url: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let req = http::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json; charset=utf-8")
            .body(Full::new(Bytes::from(bytes)))?;
        let resp = tokio::time::timeout(Duration::from_secs(60), http.request(req))
            .await
            .with_context(|| format!("{method} {url}: no answer in 60 s"))??;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((status, v["value"].clone()))
    }

    /// A command of this session: its `value`, or the WebDriver error.
    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let (status, v) = Self::raw(&self.http, method, &url, body).await?;
        if status != 200 {
            bail!("{method} {path}: {status} {v}");
        }
        Ok(v)
    }

    async fn start(driver: &Driver, shots: PathBuf) -> Result<Browser> {
        let http = Client::builder(TokioExecutor::new()).build_http();
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let mut options = json!({"args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900",
            format!("--user-data-dir={}", driver._profile.path().display()),
        ]});
        if Path::new(&chromium).exists() {
            options["binary"] = json!(chromium);
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options}}});
        let (status, v) = Self::raw(
            &http,
            "POST",
            &format!("{}/session", driver.base),
            Some(caps),
        )
        .await?;
        let session = v["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no session ({status}): {v}"))?
            .to_string();
        Ok(Browser {
            http,
            session,
            base: driver.base.clone(),
            shots,
        })
    }

    async fn goto(&self, url: &str) -> Result<()> {
        self.cmd("POST", "/url", Some(json!({"url": url})))
            .await
            .map(drop)
    }

    /// The first element matching `css`, if any.
    async fn find(&self, css: &str) -> Result<Option<String>> {
        let url = format!("{}/session/{}/element", self.base, self.session);
        let (status, v) = Self::raw(
            &self.http,
            "POST",
            &url,
            Some(json!({"using": "css selector", "value": css})),
        )
        .await?;
        match status {
            200 => Ok(v[ELEMENT].as_str().map(str::to_string)),
            404 if v["error"] == "no such element" => Ok(None),
            _ => bail!("find {css}: {status} {v}"),
        }
    }

    async fn count(&self, css: &str) -> Result<usize> {
        let v = self
            .cmd(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(v.as_array().map_or(0, Vec::len))
    }

    async fn text(&self, el: &str) -> Result<String> {
        let v = self
            .cmd("GET", &format!("/element/{el}/text"), None)
            .await?;
        Ok(v.as_str().unwrap_or("").to_string())
    }

    async fn displayed(&self, el: &str) -> Result<bool> {
        let v = self
            .cmd("GET", &format!("/element/{el}/displayed"), None)
            .await?;
        Ok(v.as_bool().unwrap_or(false))
    }

    async fn click(&self, css: &str) -> Result<()> {
        let el = self.wait_shown(css).await?;
        self.cmd("POST", &format!("/element/{el}/click"), Some(json!({})))
            .await
            .map(drop)
    }

    async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let el = self.wait_shown(css).await?;
        self.cmd("POST", &format!("/element/{el}/clear"), Some(json!({})))
            .await?;
        self.cmd(
            "POST",
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .await
        .map(drop)
    }

    /// Polls until an element matching `css` is displayed and its text
    /// satisfies `ok`; returns the text. Fails at the deadline with what
    /// was seen.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut seen = String::from("(no such element)");
        loop {
            if let Some(el) = self.find(css).await? {
                if self.displayed(&el).await.unwrap_or(false) {
                    seen = self.text(&el).await.unwrap_or_default();
                    if ok(&seen) {
                        return Ok(seen);
                    }
                } else {
                    seen = "(hidden)".into();
                }
            }
            if Instant::now() > deadline {
                let status = match self.find("#status").await? {
                    Some(s) => self.text(&s).await.unwrap_or_default(),
                    None => String::new(),
                };
                bail!(
                    "{css}: not as expected within {DEADLINE:?}; saw {seen:?}; #status {status:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_shown(&self, css: &str) -> Result<String> {
        self.wait_text(css, |_| true).await?;
        self.find(css)
            .await?
            .ok_or_else(|| anyhow!("{css} went away"))
    }

    async fn screenshot(&self, name: &str) -> Result<PathBuf> {
        let v = self.cmd("GET", "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or(""))
            .context("screenshot base64")?;
        std::fs::create_dir_all(&self.shots)?;
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        println!("screenshot: {}", path.display());
        Ok(path)
    }

    /// Emulates a device of `width`×`height` CSS pixels (Chrome DevTools
    /// through chromedriver), or clears the emulation (`None`).
    async fn device(&self, size: Option<(u32, u32)>) -> Result<()> {
        let (cmd, params) = match size {
            Some((w, h)) => (
                "Emulation.setDeviceMetricsOverride",
                json!({"width": w, "height": h, "deviceScaleFactor": 2, "mobile": true}),
            ),
            None => ("Emulation.clearDeviceMetricsOverride", json!({})),
        };
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
        .map(drop)
    }

    async fn quit(&self) {
        let _ = self.cmd("DELETE", "", None).await;
    }
}

/// Starts chromedriver on a free port; `None` (skip) when it is absent
/// and `CI` is not set.
async fn chromedriver() -> Result<Option<Driver>> {
    let bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    if !Path::new(&bin).exists() {
        if std::env::var_os("CI").is_some() {
            bail!("{bin} is missing and CI is set: install chromium and chromium-driver");
        }
        println!("note: {bin} is missing: the browser test is skipped (install chromium and chromium-driver)");
        return Ok(None);
    }
    let port = free_port()?;
    let child = Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {bin}"))?;
    let driver = Driver {
        child,
        base: format!("http://127.0.0.1:{port}"),
        _profile: TempDir::new("chromium"),
    };
    let http: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok((200, v)) =
            Browser::raw(&http, "GET", &format!("{}/status", driver.base), None).await
        {
            if v["ready"] == true {
                return Ok(Some(driver));
            }
        }
        if Instant::now() > deadline {
            bail!("chromedriver did not answer on {port} within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn claim(ns: &str, name: &str, kind: &str, pool: &str, cluster: &str) -> Value {
    json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"clusterName": cluster,
                 "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": kind, "name": pool}}})
}

/// Two pools with claims (through the plain HTTP API) and a summary with
/// two machines (written to the store as the reconcile would).
async fn seed(app: &App) {
    let ok =
        |r: &metal_ipam_tests::harness::Resp| assert!(r.status < 300, "{} {}", r.status, r.text());
    ok(&app
        .call(
            "PUT",
            "/v1/pools/team-a/nodes",
            Some(&pool_json(
                "team-a",
                "nodes",
                &["10.20.0.10-10.20.0.29"],
                24,
            )),
        )
        .await);
    ok(&app
        .call(
            "PUT",
            "/v1/global-pools/edge",
            Some(&json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
                "metadata": {"name": "edge"}, "spec": {"addresses": ["10.30.0.1-10.30.0.4"], "prefix": 28}})),
        )
        .await);
    for n in ["cp-0", "cp-1", "cp-2"] {
        ok(&app
            .call(
                "POST",
                "/v1/claims",
                Some(&claim("team-a", n, "MetalIPPool", "nodes", "prod")),
            )
            .await);
    }
    ok(&app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim(
                "team-b",
                "lb-0",
                "GlobalMetalIPPool",
                "edge",
                "edge-1",
            )),
        )
        .await);
    // A prefix pool with one claim: its rows are sub-prefixes.
    ok(&app
        .call(
            "PUT",
            "/v1/prefix-pools/team-a/pods",
            Some(
                &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
                "metadata": {"name": "pods", "namespace": "team-a"},
                "spec": {"prefixes": ["fd00:7::/61"]}}),
            ),
        )
        .await);
    ok(&app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim(
                "team-a",
                "pods-0",
                "MetalPrefixPool",
                "pods",
                "prod",
            )),
        )
        .await);
    let machine = |name: &str, phase: &str, addr: &str| MachineRow {
        namespace: "team-a".into(),
        name: name.into(),
        cluster: Some("prod".into()),
        profile: Some("hybrid-storage".into()),
        device: Some(format!("7c2d-{name}")),
        phase: phase.into(),
        ports: vec![PortRow {
            port: "bond0".into(),
            mode: "hybrid".into(),
            vlans: vec!["1001".into(), "1002".into()],
        }],
        addresses: BTreeMap::from([("1001".into(), format!("{addr}/24"))]),
        error: None,
    };
    let summary = Summary {
        v: SUMMARY_VERSION,
        at: 1_780_000_000,
        duration_ms: 840,
        machines: vec![
            machine("worker-0", "converged", "10.20.0.11"),
            machine("worker-1", "in-progress", "10.20.0.12"),
        ],
        ..Summary::default()
    };
    app.store()
        .await
        .set("obs/summary", &serde_json::to_vec(&summary).unwrap())
        .await
        .expect("summary seeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_in_a_real_browser() -> Result<()> {
    let Some(driver) = chromedriver().await? else {
        return Ok(());
    };
    let app = Arc::new(App::with_variables(&[("read_token", READ)]));
    seed(&app).await;
    let base = serve(app.clone()).await?;
    let shots = repo_root().join("target/ui-screenshots");
    let b = Browser::start(&driver, shots).await?;
    let result = scenario(&b, &base).await;
    if result.is_err() {
        let _ = b.screenshot("failure").await;
    }
    b.quit().await;
    result
}

async fn scenario(b: &Browser, base: &str) -> Result<()> {
    // (a) No token: the login form, no pool data.
    b.goto(&format!("{base}/ui")).await?;
    b.wait_shown("#login").await?;
    b.wait_shown("#token").await?;
    b.wait_text("label[for=token]", |t| t.contains("token"))
        .await?;
    assert_eq!(
        b.count("#pools tbody tr").await?,
        0,
        "no pool data before sign-in"
    );
    let pools_shown = match b.find("#pools").await? {
        Some(el) => b.displayed(&el).await?,
        None => false,
    };
    assert!(!pools_shown, "the pools table is hidden before sign-in");
    b.screenshot("login").await?;

    // A wrong token: back to the login with a message.
    b.type_into("#token", "not-the-token").await?;
    b.click("#login button[type=submit]").await?;
    b.wait_text("#status", |t| t.contains("not accepted"))
        .await?;
    b.wait_shown("#login").await?;

    // (b) Signed in with the read token: every pool, used count and
    // utilisation.
    b.type_into("#token", READ).await?;
    b.click("#login button[type=submit]").await?;
    let used = b
        .wait_text(r#"#pools tr[data-pool="team-a/nodes"] .used"#, |t| {
            !t.is_empty()
        })
        .await?;
    assert_eq!(used, "3");
    let util = b
        .wait_text(r#"#pools tr[data-pool="team-a/nodes"] .util"#, |_| true)
        .await?;
    assert!(util.contains("3/20") && util.contains("15%"), "{util}");
    assert_eq!(
        b.wait_text(r#"#pools tr[data-pool="edge"] .used"#, |_| true)
            .await?,
        "1"
    );
    let util = b
        .wait_text(r#"#pools tr[data-pool="edge"] .util"#, |_| true)
        .await?;
    assert!(util.contains("1/4") && util.contains("25%"), "{util}");
    b.wait_text("#signout", |t| t.contains("Sign out")).await?;
    b.screenshot("pools").await?;

    // (c) The pool's detail: holders.
    b.click(r#"#pools tr[data-pool="team-a/nodes"] a"#).await?;
    let row = b
        .wait_text(r#"#addresses tr[data-address="10.20.0.10"]"#, |t| {
            t.contains("cp-0")
        })
        .await?;
    assert!(
        row.contains("team-a/cp-0") && row.contains("prod") && row.contains("bound"),
        "{row}"
    );
    let row = b
        .wait_text(r#"#addresses tr[data-address="10.20.0.11"]"#, |_| true)
        .await?;
    assert!(
        row.contains("team-a/cp-1") && row.contains("team-a/worker-0"),
        "{row}"
    );
    b.wait_text("#free", |t| t.contains("10.20.0.13-10.20.0.29"))
        .await?;
    b.wait_shown("#pool-detail").await?;
    b.screenshot("pool-detail").await?;

    // (c') A prefix pool's detail, reached from the list (its id is marked
    // `+`, which picks the prefix pools' data route).
    b.goto(&format!("{base}/ui#/pools")).await?;
    b.click(r#"#pools tr[data-pool="+team-a/pods"] a"#).await?;
    let row = b
        .wait_text(r#"#addresses tr[data-address="fd00:7::/64"]"#, |t| {
            t.contains("pods-0")
        })
        .await?;
    assert!(
        row.contains("team-a/pods-0") && row.contains("bound"),
        "{row}"
    );
    b.wait_text("#free", |t| t.contains("fd00:7:0:1::/64-fd00:7:0:7::/64"))
        .await?;

    // (d) Search by address, typed into the search box.
    b.goto(&format!("{base}/ui#/search")).await?;
    b.type_into("#search", "10.20.0.12\u{E007}").await?;
    let row = b
        .wait_text(r#"#results tr[data-claim="team-a/cp-2"]"#, |_| true)
        .await?;
    assert!(
        row.contains("team-a/nodes") && row.contains("bound"),
        "{row}"
    );
    b.wait_text(r#"#results tr[data-machine="team-a/worker-1"]"#, |_| true)
        .await?;
    b.screenshot("search").await?;

    // (e) Machines.
    b.goto(&format!("{base}/ui#/machines")).await?;
    let row = b
        .wait_text(r#"#machines tr[data-machine="team-a/worker-0"]"#, |_| true)
        .await?;
    assert!(
        row.contains("bond0 hybrid: 1001, 1002")
            && row.contains("10.20.0.11/24")
            && row.contains("converged"),
        "{row}"
    );
    b.wait_text("#machines-meta", |t| t.starts_with("As of 2026-05-28"))
        .await?;
    b.screenshot("machines").await?;

    // (f) A phone: the pools view at 390×844.
    b.device(Some((390, 844))).await?;
    b.goto(&format!("{base}/ui#/pools")).await?;
    b.wait_text(r#"#pools tr[data-pool="team-a/nodes"] .used"#, |t| t == "3")
        .await?;
    b.screenshot("pools-phone").await?;
    b.device(None).await?;

    // Sign out: the login again, the data gone.
    b.click("#signout").await?;
    b.wait_shown("#login").await?;
    assert_eq!(
        b.count("#pools tbody tr").await?,
        0,
        "no pool data after sign-out"
    );
    Ok(())
}
