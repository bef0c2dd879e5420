//! Day-2 behaviour of the Metal half through the real components (the
//! `.wasm` files and `spin.toml`, on the test host and, with `SPIN_BIN`, on
//! real Spin's SQLite store), against FakeKube and the Metal simulator:
//! every outbound call bounded in time, errors that say what is wrong.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metal_ipam_tests::fake_kube::{FakeKube, METAL_GROUP};
use metal_ipam_tests::harness::{free_port, given, App, Runtime, TempDir};
use metal_ipam_tests::metal_sim::{Fault, MetalSim};
use metal_ipam_tests::vrf_world::{metal_app_on, pool_object, NS, POOL};

/// Real Spin on SQLite and the test host; the Redis store adds nothing to
/// what these tests look at.
async fn not_redis(runtime: Runtime) -> Option<Runtime> {
    if runtime == Runtime::SpinRedis {
        return None;
    }
    given(runtime).await
}

/// An HTTPS server whose certificate nobody trusts (`openssl s_server`
/// with a fresh self-signed certificate for 127.0.0.1), killed on drop.
struct UntrustedTls {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl UntrustedTls {
    fn start() -> UntrustedTls {
        let dir = TempDir::new("tls");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ]);
        let port = free_port().expect("a free port");
        let child = Command::new("openssl")
            .args([
                "s_server", "-quiet", "-www", "-cert", "cert.pem", "-key", "key.pem",
            ])
            .args(["-accept", &format!("127.0.0.1:{port}")])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s_server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        UntrustedTls {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for UntrustedTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A certificate problem towards the API server is a configuration
/// problem: 500 `KubeTlsFailed`, saying to check the CA, not a 503 "retry"
/// that looks like an outage forever.
async fn an_untrusted_api_server_certificate_says_so(runtime: Runtime) {
    let tls = UntrustedTls::start();
    let vars = [
        ("k8s_api_url", format!("https://127.0.0.1:{}", tls.port)),
        ("k8s_token", "t".to_string()),
    ];
    let app = App::on(runtime, &vars, &[]).await.expect("given");
    let r = app.call("POST", "/v1/reconcile", None).await;
    assert_eq!(
        (r.status, r.reason()),
        (500, "KubeTlsFailed"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("certificate"), "{message}");
    assert!(r.headers.get("retry-after").is_none(), "not a retry");
}

/// A Metal call that never answers is cut off by the request's deadline
/// (the 10 s budget), and the step says what happened: a create whose
/// outcome is unknown (503 `MetalOutcomeUnknown`), not a hung request.
async fn a_metal_call_that_never_answers_is_cut_off(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = MetalSim::start().await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool_object());
    // The VRF create is held far longer than any budget.
    sim.inject("POST", "createVrf", Fault::Latency(120_000), 1);
    let started = Instant::now();
    let r = app
        .call("POST", &format!("/v1/metal/pools/{NS}/{POOL}"), None)
        .await;
    let took = started.elapsed();
    assert_eq!(
        (r.status, r.reason()),
        (503, "MetalOutcomeUnknown"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    assert!(r.headers.get("retry-after").is_some());
    // The budget (10 s) and the last attempt's floor, plus the step's own
    // work: never the two minutes the call was held.
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(15),
        "{}: answered after {took:?}",
        runtime.name()
    );
    let detail = r.body.to_string();
    assert!(
        detail.contains("MetalOutcomeUnknown"),
        "the step reports it: {detail}"
    );
    // The pool says it too, and nothing was created twice.
    let pool = kube
        .get(METAL_GROUP, "metalippools", Some(NS), POOL)
        .unwrap();
    assert!(sim.vrfs().len() <= 1, "{:?}", sim.vrfs());
    assert!(pool["metadata"]["finalizers"].is_array());
}

metal_ipam_tests::on_every_runtime!(
    not_redis: an_untrusted_api_server_certificate_says_so,
    a_metal_call_that_never_answers_is_cut_off,
);
