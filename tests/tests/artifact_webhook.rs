//! The admission webhook as the clusterctl artifact installs it, called by
//! the real API server: its `ValidatingWebhookConfiguration` from
//! `deploy/clusterctl/ipam-components.yaml` (substituted as `clusterctl
//! init` does with only the required variables set, so `failurePolicy:
//! Fail` stands), an HTTPS endpoint in front of real Spin (what the
//! artifact's Ingress is in a cluster), the API server authenticating with
//! the bearer token through its admission configuration
//! (`deploy/admission-config.example.yaml`), and the RBAC and CRDs of the
//! same artifact (`real_kube` installs them).
//!
//! What must hold: a valid pool is admitted (so the API server reached the
//! app and the app accepted its token); an overlapping pool, an invalid
//! one and the deletion of a pool with an allocated address are refused
//! with the webhook's reason and leave nothing behind; with the app
//! unreachable every pool write is refused; a claim is served and
//! released between those writes as in the CAPI scenarios.
//!
//! Needs `SPIN_BIN` and `KUBEBUILDER_ASSETS`; skipped otherwise. This file
//! is its own test process, so its control plane has no other test's
//! webhook.

use metal_ipam_tests::fake_kube::{DeleteOutcome, IPAM_GROUP, METAL_GROUP};
use metal_ipam_tests::harness::{pool_json, App, Resp, Runtime};
use metal_ipam_tests::kube::deployed_client_tls_components;
use metal_ipam_tests::real_kube::{ArtifactWebhook, ControlPlane, Session};
use metal_ipam_tests::real_spin::{ClientTls, SpinBin};
use serde_json::{json, Value};

const NS: &str = "team-webhook";
const HOOK: &str = "pools.ipam.metal-ipam.dev";

/// Field order is drop order: the webhook goes before the app and the
/// session (whose next wipe deletes pools).
struct World {
    hook: ArtifactWebhook,
    app: App,
    kube: Session,
}

async fn world(runtime: Runtime) -> Option<World> {
    SpinBin::from_env()?;
    let cp = ControlPlane::get()?;
    let kube = tokio::task::block_in_place(|| cp.session());
    let vars = [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
    ];
    let tls = [ClientTls {
        component_ids: deployed_client_tls_components(),
        hosts: vec!["127.0.0.1".into()],
        ca_roots_file: kube.ca_file().to_path_buf(),
    }];
    let app = App::on(runtime, &vars, &tls).await?;
    let base_url = app.base_url().expect("a Spin app has a URL").to_owned();
    let hook = tokio::task::block_in_place(|| cp.install_artifact_webhook(&base_url))
        .unwrap_or_else(|e| panic!("installing the artifact's webhook: {e}"));
    Some(World { hook, app, kube })
}

impl World {
    /// A watch event for the object as stored.
    async fn touch(&self, plural: &str, name: &str) -> Resp {
        let group = if plural == "metalippools" {
            METAL_GROUP
        } else {
            IPAM_GROUP
        };
        let ev = match self.kube.get(group, plural, Some(NS), name) {
            Some(obj) => json!({"type": "MODIFIED", "object": obj}),
            None => panic!("{plural}/{name} is gone: send its DELETED event"),
        };
        self.event(ev).await
    }

    async fn event(&self, ev: Value) -> Resp {
        let r = self.app.call("POST", "/v1/events", Some(&ev)).await;
        assert!(r.status < 300, "event: {} {}", r.status, r.text());
        r
    }

    fn pool(&self, name: &str) -> Option<Value> {
        self.kube.get(METAL_GROUP, "metalippools", Some(NS), name)
    }

    fn create(&self, obj: Value) -> Result<Value, metal_ipam_tests::fake_kube::ApiError> {
        tokio::task::block_in_place(|| self.kube.try_create(obj))
    }
}

fn claim(name: &str, pool: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"poolRef": {"apiGroup": METAL_GROUP, "kind": "MetalIPPool", "name": pool}},
    })
}

/// The webhook's denial as the API server relays it: `status.code` and
/// `status.reason` from the app's AdmissionReview, the message prefixed
/// with the webhook's name.
fn assert_denied(r: Result<Value, metal_ipam_tests::fake_kube::ApiError>, code: u16, reason: &str) {
    let e = r.expect_err("the webhook refuses it");
    assert_eq!((e.code, e.reason.as_str()), (code, reason), "{e}");
    assert!(
        e.message
            .starts_with(&format!("admission webhook \"{HOOK}\" denied the request")),
        "{e}"
    );
}

async fn the_artifact_s_webhook_guards_pools_on_the_real_api_server(w: World) {
    // The configuration as clusterctl installs it: the default failure
    // policy, the URL on the endpoint's host, our CA.
    for hook in w.hook.configuration()["webhooks"].as_array().unwrap() {
        assert_eq!(hook["failurePolicy"], "Fail");
        assert!(hook["clientConfig"]["caBundle"].is_string());
    }

    // A valid pool is admitted: the API server reached the app over HTTPS
    // and the app took its bearer token (a 401 would be a failed call,
    // which failurePolicy Fail turns into a refusal).
    w.create(pool_json(NS, "a", &["10.60.0.10-10.60.0.20"], 24))
        .expect("a valid pool is admitted");
    w.touch("metalippools", "a").await;

    // An invalid pool and one overlapping pool a: refused, not stored.
    assert_denied(
        w.create(pool_json(NS, "reversed", &["10.60.1.20-10.60.1.10"], 24)),
        422,
        "Invalid",
    );
    assert_denied(
        w.create(pool_json(NS, "b", &["10.60.0.15"], 24)),
        422,
        "PoolOverlap",
    );
    assert!(w.pool("reversed").is_none() && w.pool("b").is_none());

    // A claim on pool a gets its address.
    w.create(claim("c1", "a")).expect("the claim is created");
    w.touch("ipaddressclaims", "c1").await;
    let address = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "c1")
        .expect("the claim's IPAddress");
    assert_eq!(address["spec"]["address"], "10.60.0.10");

    // Pool a cannot go while its address is allocated.
    assert_denied(
        tokio::task::block_in_place(|| {
            w.kube
                .try_delete(METAL_GROUP, "metalippools", Some(NS), "a")
        })
        .map(|_| Value::Null),
        403,
        "PoolInUse",
    );
    assert!(w
        .pool("a")
        .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null()));

    // With the app unreachable, failurePolicy Fail refuses every pool write.
    w.hook.reach_app(false);
    let e = w
        .create(pool_json(NS, "c", &["10.60.2.10"], 24))
        .expect_err("no webhook answer, no pool");
    assert!(
        e.message
            .contains(&format!("failed calling webhook \"{HOOK}\"")),
        "{e}"
    );
    assert!(w.pool("c").is_none());
    w.hook.reach_app(true);

    // The claim released, the pool can go, and does.
    let gone = tokio::task::block_in_place(|| {
        w.kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "c1")
    });
    match gone {
        Some(DeleteOutcome::Finalizing(_)) => {
            w.touch("ipaddressclaims", "c1").await;
        }
        other => panic!("the claim carries the provider's finalizer: {other:?}"),
    }
    assert!(w
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "c1")
        .is_none());
    assert!(w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "c1")
        .is_none());
    match tokio::task::block_in_place(|| {
        w.kube
            .try_delete(METAL_GROUP, "metalippools", Some(NS), "a")
    }) {
        Ok(Some(DeleteOutcome::Finalizing(_))) => {
            w.touch("metalippools", "a").await;
        }
        Ok(Some(DeleteOutcome::Removed(last))) => {
            w.event(json!({"type": "DELETED", "object": last})).await;
        }
        other => panic!("deleting the released pool: {other:?}"),
    }
    assert!(w.pool("a").is_none());
    assert!(w.kube.forbidden().is_empty(), "{:?}", w.kube.forbidden());
    assert!(
        w.kube.schema_violations().is_empty(),
        "{:?}",
        w.kube.schema_violations()
    );
}

// Real Spin only: the API server must reach the app over the network.
mod spin_sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_artifact_s_webhook_guards_pools_on_the_real_api_server() {
        if let Some(w) = super::world(metal_ipam_tests::harness::Runtime::SpinSqlite).await {
            super::the_artifact_s_webhook_guards_pools_on_the_real_api_server(w).await;
        }
    }
}

mod spin_redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_artifact_s_webhook_guards_pools_on_the_real_api_server() {
        if let Some(w) = super::world(metal_ipam_tests::harness::Runtime::SpinRedis).await {
            super::the_artifact_s_webhook_guards_pools_on_the_real_api_server(w).await;
        }
    }
}
