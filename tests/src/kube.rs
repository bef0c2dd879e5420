//! The Kubernetes API server a test talks to: [`FakeKube`] in-process, or
//! a real kube-apiserver ([`crate::real_kube`], from `KUBEBUILDER_ASSETS`)
//! — one interface, so a CAPI scenario is written once and runs on both.
//!
//! Seeding and inspection (`create`, `get`, `put`, `delete`, `list`) and recording
//! (`requests`, `writes`, `schema_violations`) behave the same on both,
//! with two differences the tests must allow for:
//! - a real server collects garbage in the background (kube-controller-
//!   manager), FakeKube at once; no scenario depends on either;
//! - fault injection and paging controls exist on FakeKube only
//!   ([`Kube::fake`]); tests that need them run on the test host only.

use serde::Deserialize as _;
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
    /// deployed one (`deploy/secrets.example.yaml`'s runtime config, with
    /// its `component_ids` as they are) with the test CA for the file and
    /// `127.0.0.1` for the host. None for FakeKube (plain HTTP).
    pub fn client_tls(&self) -> Vec<ClientTls> {
        let Kube::Real(s) = self else {
            return Vec::new();
        };
        vec![ClientTls {
            component_ids: deployed_client_tls_components(),
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

    /// Every stored object of a kind, in all namespaces, ordered by
    /// namespace and name (see [`FakeKube::list`]; on the real server one
    /// unpaged LIST as the admin).
    ///
    /// # Panics
    /// If `plural.group` is not served, or the LIST fails.
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

    /// The application's writes refused by validation (422) — and, on
    /// FakeKube, its writes that did not ask for `fieldValidation=Strict`
    /// ([`FakeKube::lax_writes`]), which a real server would have accepted
    /// with unknown fields dropped.
    pub fn schema_violations(&self) -> Vec<String> {
        match self {
            Kube::Fake(k) => {
                let mut v = k.schema_violations();
                v.extend(k.lax_writes());
                v
            }
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
}

/// The `component_ids` of the `[[client_tls]]` block in the runtime config
/// that `deploy/secrets.example.yaml` ships (the one SpinKube mounts).
///
/// # Panics
/// If the file, its runtime config or the block is missing.
pub fn deployed_client_tls_components() -> Vec<String> {
    let path = repo_root().join("deploy/secrets.example.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/secrets.example.yaml");
    let rc = serde_norway::Deserializer::from_str(&text)
        .filter_map(|d| serde_json::Value::deserialize(d).ok())
        .find_map(|doc| {
            doc.pointer("/stringData/runtime-config.toml")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .expect("a Secret with stringData.runtime-config.toml");
    let rc: toml::Table = toml::from_str(&rc).expect("the deployed runtime config parses");
    rc["client_tls"][0]["component_ids"]
        .as_array()
        .expect("[[client_tls]] component_ids")
        .iter()
        .map(|v| v.as_str().expect("a component id").to_string())
        .collect()
}
