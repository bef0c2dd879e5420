//! The Kubernetes API server a test talks to: [`FakeKube`] in-process, or
//! a real kube-apiserver ([`crate::real_kube`], from `KUBEBUILDER_ASSETS`)
//! — one interface, so a CAPI scenario is written once and runs on both.
//!
//! Seeding and inspection (`create`, `get`, `put`, `delete`, `list`) and
//! recording (`requests`, `writes`, `schema_violations`) behave the same on
//! both, with two differences the tests must allow for:
//! - a real server collects garbage in the background (kube-controller-
//!   manager), FakeKube at once: wait with [`Kube::eventually`];
//! - fault injection and paging controls exist on FakeKube only
//!   ([`Kube::fake`]); tests that need them run on the test host only.

use serde_json::Value;

use crate::fake_kube::{DeleteOutcome, FakeKube, Recorded};
use crate::real_kube::Session;
use crate::real_spin::ClientTls;
use crate::schema::repo_root;

/// FakeKube or a session on the real control plane.
#[derive(Debug)]
pub enum Kube {
    /// The in-process fake.
    Fake(FakeKube),
    /// Exclusive use of the real API server for one test.
    Real(Session),
}

impl Kube {
    /// The URL the application is given as `k8s_api_url`.
    pub fn base_url(&self) -> String {
        match self {
            Kube::Fake(k) => k.base_url(),
            Kube::Real(s) => s.base_url(),
        }
    }

    /// The token the application is given as `k8s_token`: FakeKube's, or
    /// one minted for `deploy/rbac.yaml`'s ServiceAccount.
    pub fn token(&self) -> &str {
        match self {
            Kube::Fake(k) => k.token(),
            Kube::Real(s) => s.token(),
        }
    }

    /// Whether this is the real API server.
    pub fn is_real(&self) -> bool {
        matches!(self, Kube::Real(_))
    }

    /// The fake, for fault injection and paging controls.
    ///
    /// # Panics
    /// On the real API server.
    pub fn fake(&self) -> &FakeKube {
        match self {
            Kube::Fake(k) => k,
            Kube::Real(_) => {
                panic!("fault injection needs FakeKube; this test runs on the host only")
            }
        }
    }

    /// The `[[client_tls]]` block real Spin needs to trust this server: the
    /// test CA for `127.0.0.1`, for every component of `spin.toml` allowed
    /// to call `{{ k8s_api_url }}` (as `deploy/` configures it with the
    /// cluster's CA). None for FakeKube (plain HTTP).
    pub fn client_tls(&self) -> Vec<ClientTls> {
        let Kube::Real(s) = self else {
            return Vec::new();
        };
        vec![ClientTls {
            component_ids: components_calling_kubernetes(),
            hosts: vec!["127.0.0.1".into()],
            ca_roots_file: s.ca_file().to_path_buf(),
        }]
    }

    /// See [`FakeKube::create`].
    pub fn create(&self, obj: Value) -> Value {
        match self {
            Kube::Fake(k) => k.create(obj),
            Kube::Real(s) => s.create(obj),
        }
    }

    /// See [`FakeKube::get`].
    pub fn get(&self, group: &str, plural: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        match self {
            Kube::Fake(k) => k.get(group, plural, ns, name),
            Kube::Real(s) => s.get(group, plural, ns, name),
        }
    }

    /// See [`FakeKube::put`].
    pub fn put(&self, obj: Value) -> Value {
        match self {
            Kube::Fake(k) => k.put(obj),
            Kube::Real(s) => s.put(obj),
        }
    }

    /// See [`FakeKube::delete`].
    pub fn delete(
        &self,
        group: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<DeleteOutcome> {
        match self {
            Kube::Fake(k) => k.delete(group, plural, ns, name),
            Kube::Real(s) => s.delete(group, plural, ns, name),
        }
    }

    /// See [`FakeKube::list`].
    pub fn list(&self, group: &str, plural: &str) -> Vec<Value> {
        match self {
            Kube::Fake(k) => k.list(group, plural),
            Kube::Real(s) => s.list(group, plural),
        }
    }

    /// The application's requests since the last
    /// [`clear_requests`](Self::clear_requests), in order (on the real
    /// server, the ServiceAccount's requests from the audit log).
    pub fn requests(&self) -> Vec<Recorded> {
        match self {
            Kube::Fake(k) => k.requests(),
            Kube::Real(s) => s.requests(),
        }
    }

    /// The requests that could change state.
    pub fn writes(&self) -> Vec<Recorded> {
        match self {
            Kube::Fake(k) => k.writes(),
            Kube::Real(s) => s.writes(),
        }
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        match self {
            Kube::Fake(k) => k.clear_requests(),
            Kube::Real(s) => s.clear_requests(),
        }
    }

    /// The application's writes refused by validation (422).
    pub fn schema_violations(&self) -> Vec<String> {
        match self {
            Kube::Fake(k) => k.schema_violations(),
            Kube::Real(s) => s.schema_violations(),
        }
    }

    /// The application's requests answered 403 (always empty on FakeKube,
    /// which has no RBAC; there `RBAC = the code's requests` is checked
    /// from the requests themselves).
    pub fn forbidden(&self) -> Vec<String> {
        match self {
            Kube::Fake(_) => Vec::new(),
            Kube::Real(s) => s.forbidden(),
        }
    }

    /// Asserts `done()`: at once on FakeKube (whose garbage collector runs
    /// synchronously), within 30 s on the real server (whose collector runs
    /// in kube-controller-manager).
    ///
    /// # Panics
    /// When it does not hold (in time).
    #[track_caller]
    pub fn eventually(&self, what: &str, mut done: impl FnMut() -> bool) {
        match self {
            Kube::Fake(_) => assert!(done(), "{what}"),
            Kube::Real(s) => s.wait_until(what, std::time::Duration::from_secs(30), done),
        }
    }
}

/// The components of `spin.toml` whose `allowed_outbound_hosts` name
/// `{{ k8s_api_url }}`.
pub fn components_calling_kubernetes() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join("spin.toml")).expect("spin.toml");
    let manifest: toml::Table = toml::from_str(&text).expect("spin.toml parses");
    let mut out: Vec<String> = manifest
        .get("component")
        .and_then(toml::Value::as_table)
        .into_iter()
        .flatten()
        .filter(|(_, c)| {
            c.get("allowed_outbound_hosts")
                .and_then(toml::Value::as_array)
                .is_some_and(|hosts| {
                    hosts
                        .iter()
                        .any(|h| h.as_str().is_some_and(|h| h.contains("{{ k8s_api_url }}")))
                })
        })
        .map(|(id, _)| id.clone())
        .collect();
    out.sort();
    out
}
