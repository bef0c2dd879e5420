//! A phoenixNAP-backed pool's world for end-to-end tests through the app:
//! a Kubernetes API server ([`Kube`]: the fake one with the repo's CRDs, or
//! the real one on real Spin, [`World::on_real_kube`]), the phoenixNAP
//! simulator seeded with servers in one location ([`LOCATION`]), and the
//! application on the test host or real Spin ([`crate::harness::App::on`])
//! with the phoenixNAP variables pointing at the simulator (API and token
//! endpoint) and no Metal variables. The steps are driven through the
//! public routes as a forwarder would: a step answering `Retry-After` is
//! called again at once (the simulator's changes are timed by reads, not by
//! a clock).

use serde_json::{json, Value};

use crate::fake_kube::{FakeKube, IPAM_GROUP, METAL_GROUP};
use crate::harness::{App, Resp, Runtime};
use crate::kube::Kube;
use crate::pnap_sim::{PnapSim, Recorded, TOKEN_ROUTE};
use crate::real_kube::ControlPlane;
use crate::real_spin::SpinBin;

/// The namespace of the pools and claims.
pub const NS: &str = "team-a";
/// The location of the servers and pools.
pub const LOCATION: &str = "PHX";
/// The seeded servers' ids (phoenixNAP's are 24 hex digits).
pub const SERVERS: [&str; 3] = [
    "60473a6115e34466c9f8f0a1",
    "60473a6115e34466c9f8f0a2",
    "60473a6115e34466c9f8f0a3",
];

/// The simulator, the API server and the app talking to both.
pub struct World {
    /// The Kubernetes API: FakeKube, or a session on the real API server.
    pub kube: Kube,
    /// The phoenixNAP simulator.
    pub sim: PnapSim,
    /// The application.
    pub app: App,
    /// Where the app runs.
    pub runtime: Runtime,
}

/// The variables that point the app at `kube` and at `sim` as phoenixNAP.
pub fn pnap_vars(kube: &Kube, sim: &PnapSim) -> Vec<(&'static str, String)> {
    vec![
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
        ("pnap_api_url", sim.api_url()),
        ("pnap_auth_url", sim.api_url()),
        ("pnap_client_id", sim.client_id().to_string()),
        ("pnap_client_secret", sim.client_secret().to_string()),
    ]
}

/// A `MetalIPPool` backed by `phoenixnap` (the section as given).
pub fn pool_object(name: &str, phoenixnap: Value) -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"phoenixnap": phoenixnap}
    })
}

/// A claim on pool `pool` annotated with its server.
pub fn claim_object(name: &str, pool: &str, server: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS,
            "annotations": {"ipam.metal-ipam.dev/device": server}},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": pool}}
    })
}

/// The steps of an `/v1/events` answer: `"<step> <result>"`.
pub fn steps(r: &Resp) -> Vec<String> {
    r.body["steps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    format!(
                        "{} {}",
                        s["step"].as_str().unwrap_or("?"),
                        s["result"]["result"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// [`World::on`], as the setup of [`crate::on_every_runtime!`].
pub async fn on_fake(runtime: Runtime) -> Option<World> {
    World::on(runtime).await
}

/// [`World::on_real_kube`], as the setup of [`crate::on_real_kube!`].
pub async fn on_real(runtime: Runtime) -> Option<World> {
    World::on_real_kube(runtime).await
}

impl World {
    /// A world on `runtime` (`None` when that runtime is not given): the
    /// simulator seeded with [`SERVERS`] (`powered-on`, in [`LOCATION`]).
    pub async fn on(runtime: Runtime) -> Option<World> {
        Self::with_kube(runtime, Kube::Fake(FakeKube::start().await)).await
    }

    /// The same world on real Spin (`SPIN_BIN`, on `runtime`'s store)
    /// against the real API server (`KUBEBUILDER_ASSETS`; a
    /// [`crate::real_kube::Session`] of its own, which wipes what an
    /// earlier test left and keeps others out until this world is
    /// dropped): `None` when either was not given, or for
    /// [`Runtime::Host`] (the test host does not take the server's CA).
    pub async fn on_real_kube(runtime: Runtime) -> Option<World> {
        if runtime == Runtime::Host {
            return None;
        }
        SpinBin::from_env()?;
        let cp = ControlPlane::get()?;
        let kube = Kube::Real(tokio::task::block_in_place(|| cp.session()));
        Self::with_kube(runtime, kube).await
    }

    async fn with_kube(runtime: Runtime, kube: Kube) -> Option<World> {
        let sim = PnapSim::start().await;
        for (i, s) in SERVERS.iter().enumerate() {
            sim.add_server(s, &format!("node-{i}"), LOCATION);
        }
        let app = App::on(runtime, &pnap_vars(&kube, &sim), &kube.client_tls()).await?;
        Some(World {
            kube,
            sim,
            app,
            runtime,
        })
    }

    /// Where the test runs, for messages: the runtime's name, with
    /// `+kube-apiserver` on the real API server.
    pub fn who(&self) -> String {
        if self.kube.is_real() {
            format!("{}+kube-apiserver", self.runtime.name())
        } else {
            self.runtime.name()
        }
    }

    /// The pool's public step route.
    pub fn pool_path(name: &str) -> String {
        format!("/v1/metal/pools/{NS}/{name}")
    }

    /// The claim's public assign route.
    pub fn claim_path(name: &str) -> String {
        format!("/v1/metal/claims/{NS}/{name}")
    }

    /// Calls `path` until it answers without `Retry-After` (at most `n`
    /// times, at once: no sleep); the last answer and the calls made.
    ///
    /// # Panics
    /// When it still asks to be called again after `n` calls.
    pub async fn settle(&self, path: &str, n: usize) -> (Resp, usize) {
        for i in 1..=n {
            let r = self.app.call("POST", path, None).await;
            if r.headers.get("retry-after").is_none() {
                return (r, i);
            }
            assert_eq!(
                r.status,
                202,
                "{}: {path}: {:#}",
                self.runtime.name(),
                r.body
            );
        }
        panic!(
            "{}: {path}: still in progress after {n} calls",
            self.runtime.name()
        );
    }

    /// Runs the pool's step until it settles; the answer must be 200
    /// `synced`. Returns the calls made.
    pub async fn provision(&self, name: &str) -> usize {
        let (r, calls) = self.settle(&Self::pool_path(name), 10).await;
        assert_eq!(
            (r.status, r.body["result"].as_str()),
            (200, Some("synced")),
            "{}: {:#}",
            self.runtime.name(),
            r.body
        );
        calls
    }

    /// The claim delivered as an event (`ADDED`, or `DELETED` of its last
    /// object): the chained steps' answer.
    pub async fn event(&self, kind: &str, object: &Value) -> Resp {
        self.app
            .call(
                "POST",
                "/v1/events",
                Some(&json!({"type": kind, "object": object})),
            )
            .await
    }

    /// A claim on `pool` for `server`, created and delivered: the claim
    /// step binds it (the chained assign step may still be waiting for
    /// phoenixNAP). Returns the created object.
    pub async fn claim(&self, name: &str, pool: &str, server: &str) -> Value {
        let c = self.kube.create(claim_object(name, pool, server));
        let r = self.event("ADDED", &c).await;
        let s = steps(&r);
        assert_eq!(
            s.first().map(String::as_str),
            Some("allocate bound"),
            "{}: {:#}",
            self.runtime.name(),
            r.body
        );
        c
    }

    /// Runs the claim's assign step until it settles; the answer must be
    /// 200 `bound`. Returns the calls made.
    pub async fn assign(&self, name: &str) -> usize {
        let (r, calls) = self.settle(&Self::claim_path(name), 10).await;
        assert_eq!(
            (r.status, r.body["result"].as_str()),
            (200, Some("bound")),
            "{}: {:#}",
            self.runtime.name(),
            r.body
        );
        calls
    }

    /// Deletes claim `name` and delivers its `DELETED` event until the
    /// chained steps answer 200 (at most `n` times: a 503 with
    /// `Retry-After` is delivered again at once, as the forwarder would).
    /// The answers, in order.
    ///
    /// # Panics
    /// When an answer is neither 200 nor 503 with `Retry-After`, or the
    /// steps still wait after `n` deliveries.
    pub async fn delete_claim(&self, name: &str, n: usize) -> Vec<Resp> {
        let obj = self.claim_obj(name).expect("the claim");
        self.kube
            .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), name);
        let mut answers = Vec::new();
        for _ in 0..n {
            let r = self.event("DELETED", &obj).await;
            let status = r.status;
            let again = r.headers.get("retry-after").is_some();
            answers.push(r);
            if status == 200 {
                return answers;
            }
            assert!(
                status == 503 && again,
                "{}: {name}: {:#}",
                self.runtime.name(),
                answers.last().unwrap().body
            );
        }
        panic!(
            "{}: {name}: still waiting after {n} deliveries",
            self.runtime.name()
        );
    }

    /// The pool object.
    pub fn pool(&self, name: &str) -> Option<Value> {
        self.kube.get(METAL_GROUP, "metalippools", Some(NS), name)
    }

    /// The claim object.
    pub fn claim_obj(&self, name: &str) -> Option<Value> {
        self.kube.get(IPAM_GROUP, "ipaddressclaims", Some(NS), name)
    }

    /// The address bound to claim `name`.
    pub fn address(&self, name: &str) -> String {
        let ip = self
            .kube
            .get(IPAM_GROUP, "ipaddresses", Some(NS), name)
            .unwrap_or_else(|| panic!("no IPAddress {name}"));
        ip["spec"]["address"].as_str().unwrap().to_string()
    }

    /// The condition `type` of `obj`: (status, reason).
    pub fn condition(obj: &Value, type_: &str) -> (String, String) {
        let c = obj["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
            .unwrap_or_else(|| panic!("no {type_} condition: {obj:#}"));
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        (s("status"), s("reason"))
    }

    /// The simulator's requests from `from` on, token requests left out,
    /// as `"METHOD operation"`.
    pub fn calls_since(&self, from: usize) -> Vec<String> {
        api_calls(&self.sim.requests()[from..])
    }

    /// How many requests the simulator has received.
    pub fn mark(&self) -> usize {
        self.sim.requests().len()
    }

    /// No request broke a phoenixNAP spec or a CRD, and no answer the spec;
    /// on the real API server also none was refused by `deploy/rbac.yaml`'s
    /// RBAC (FakeKube has none).
    pub fn assert_clean(&self) {
        let who = self.who();
        assert_eq!(self.sim.violations(), Vec::<String>::new(), "{who}: spec");
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new(), "{who}");
        assert_eq!(
            self.kube.schema_violations(),
            Vec::<String>::new(),
            "{who}: CRDs"
        );
        assert_eq!(self.kube.forbidden(), Vec::<String>::new(), "{who}: RBAC");
    }

    /// The IPs of `server`'s memberships of `network`, in any state.
    pub fn ips_on(&self, server: &str, network: &str) -> Option<Vec<String>> {
        self.sim
            .memberships()
            .into_iter()
            .find(|m| m.server_id == server && m.network_id == network)
            .map(|m| m.ips)
    }
}

/// `"METHOD operation"` of `requests`, the token requests left out.
pub fn api_calls(requests: &[Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.operation.as_deref() != Some(TOKEN_ROUTE))
        .map(|r| {
            format!(
                "{} {}",
                r.method,
                r.operation.as_deref().unwrap_or(r.path.as_str())
            )
        })
        .collect()
}
