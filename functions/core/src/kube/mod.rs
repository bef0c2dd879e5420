//! A small, typed Kubernetes API client over the [`HttpClient`] port.
//!
//! Only what metal-ipam needs: get, paginated list, create, JSON merge
//! patch (object and `/status`), delete. Optimistic concurrency is the
//! caller's: patches that must not clobber a concurrent change carry
//! `metadata.resourceVersion`, and a 409 comes back as
//! [`KubeError::Conflict`] so the caller re-reads and retries.
//!
//! Every permission the code uses is listed in [`USED_PERMISSIONS`]; the
//! RBAC manifest in `deploy/` grants exactly that (a test compares them).

pub mod conditions;
pub mod meta;
pub mod names;
pub mod object;

use serde_json::Value;

use crate::error::{Error, ErrorKind, Known};
use crate::ports::http::{headers, Deadline, HttpClient, TransportKind};
use object::Object;

/// The deadline of every request to the API server (a list page, a
/// write; watches are not used): the whole call within 10 s, connecting
/// included, and connecting within 3 s. Not retried here: a 409 is
/// re-read by the caller, anything else answers 503 for the step's caller
/// to retry.
pub const DEADLINE: Deadline = Deadline {
    connect_ms: 3_000,
    total_ms: 10_000,
};

/// API group of our kinds (the pool kinds, `MetalNetworkProfile`).
pub const GROUP: &str = "ipam.metal-ipam.dev";
/// API version of our kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of our objects.
pub const API_VERSION: &str = "ipam.metal-ipam.dev/v1alpha1";
/// Kind of the namespaced pool.
pub const KIND_POOL: &str = "MetalIPPool";
/// Kind of the cluster-wide pool.
pub const KIND_GLOBAL_POOL: &str = "GlobalMetalIPPool";
/// Kind of the namespaced prefix pool (a sub-prefix per claim).
pub const KIND_PREFIX_POOL: &str = "MetalPrefixPool";
/// Kind of the cluster-wide prefix pool.
pub const KIND_GLOBAL_PREFIX_POOL: &str = "GlobalMetalPrefixPool";

/// A Kubernetes resource type metal-ipam reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// API group.
    pub group: &'static str,
    /// Version used for every request.
    pub version: &'static str,
    /// Plural resource name (URL segment).
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl Resource {
    /// `group/version`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }
}

/// CAPI `IPAddressClaim` (served at v1beta2; the API server converts).
pub const CLAIMS: Resource = Resource {
    group: "ipam.cluster.x-k8s.io",
    version: "v1beta2",
    plural: "ipaddressclaims",
    kind: "IPAddressClaim",
    namespaced: true,
};

/// CAPI `IPAddress`.
pub const IP_ADDRESSES: Resource = Resource {
    group: "ipam.cluster.x-k8s.io",
    version: "v1beta2",
    plural: "ipaddresses",
    kind: "IPAddress",
    namespaced: true,
};

/// CAPI `Cluster` (for the pause check).
pub const CLUSTERS: Resource = Resource {
    group: "cluster.x-k8s.io",
    version: "v1beta2",
    plural: "clusters",
    kind: "Cluster",
    namespaced: true,
};

/// Our `MetalIPPool`.
pub const METAL_IP_POOLS: Resource = Resource {
    group: GROUP,
    version: VERSION,
    plural: "metalippools",
    kind: KIND_POOL,
    namespaced: true,
};

/// Our `GlobalMetalIPPool`.
pub const GLOBAL_METAL_IP_POOLS: Resource = Resource {
    group: GROUP,
    version: VERSION,
    plural: "globalmetalippools",
    kind: KIND_GLOBAL_POOL,
    namespaced: false,
};

/// Our `MetalPrefixPool`.
pub const METAL_PREFIX_POOLS: Resource = Resource {
    group: GROUP,
    version: VERSION,
    plural: "metalprefixpools",
    kind: KIND_PREFIX_POOL,
    namespaced: true,
};

/// Our `GlobalMetalPrefixPool`.
pub const GLOBAL_METAL_PREFIX_POOLS: Resource = Resource {
    group: GROUP,
    version: VERSION,
    plural: "globalmetalprefixpools",
    kind: KIND_GLOBAL_PREFIX_POOL,
    namespaced: false,
};

/// The in-cluster IPAM provider's group (the CAPI IPAM group), for the
/// pools metal-ipam serves during a takeover (`capi::takeover`).
pub const IN_CLUSTER_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The in-cluster provider's storage version of its pools.
pub const IN_CLUSTER_VERSION: &str = "v1alpha2";

/// The in-cluster provider's `InClusterIPPool`.
pub const IN_CLUSTER_IP_POOLS: Resource = Resource {
    group: IN_CLUSTER_GROUP,
    version: IN_CLUSTER_VERSION,
    plural: "inclusterippools",
    kind: "InClusterIPPool",
    namespaced: true,
};

/// The in-cluster provider's `GlobalInClusterIPPool`.
pub const GLOBAL_IN_CLUSTER_IP_POOLS: Resource = Resource {
    group: IN_CLUSTER_GROUP,
    version: IN_CLUSTER_VERSION,
    plural: "globalinclusterippools",
    kind: "GlobalInClusterIPPool",
    namespaced: false,
};

/// The in-cluster provider's `InClusterPrefixPool`.
pub const IN_CLUSTER_PREFIX_POOLS: Resource = Resource {
    group: IN_CLUSTER_GROUP,
    version: IN_CLUSTER_VERSION,
    plural: "inclusterprefixpools",
    kind: "InClusterPrefixPool",
    namespaced: true,
};

/// The in-cluster provider's `GlobalInClusterPrefixPool`.
pub const GLOBAL_IN_CLUSTER_PREFIX_POOLS: Resource = Resource {
    group: IN_CLUSTER_GROUP,
    version: IN_CLUSTER_VERSION,
    plural: "globalinclusterprefixpools",
    kind: "GlobalInClusterPrefixPool",
    namespaced: false,
};

/// `apps/v1` `Deployment`: the in-cluster provider's controller, whose
/// replicas fence a takeover (read only, one name).
pub const DEPLOYMENTS: Resource = Resource {
    group: "apps",
    version: "v1",
    plural: "deployments",
    kind: "Deployment",
    namespaced: true,
};

/// CAPI `Machine`: its `spec.providerID` names the Metal device
/// (`equinixmetal://<uuid>`) of a claim it owns.
pub const MACHINES: Resource = Resource {
    group: "cluster.x-k8s.io",
    version: "v1beta2",
    plural: "machines",
    kind: "Machine",
    namespaced: true,
};

/// CAPP's `PacketMachine` (the Equinix Metal infrastructure machine): its
/// `spec.providerID` names the device of a claim it owns.
pub const PACKET_MACHINES: Resource = Resource {
    group: "infrastructure.cluster.x-k8s.io",
    version: "v1beta1",
    plural: "packetmachines",
    kind: "PacketMachine",
    namespaced: true,
};

/// phoenixNAP's `BMCMachine` (the infrastructure machine of its Cluster API
/// provider): its `spec.providerID` (`bmc://servers/<id>`) names the server
/// of a claim it owns.
pub const BMC_MACHINES: Resource = Resource {
    group: "infrastructure.cluster.x-k8s.io",
    version: "v1beta1",
    plural: "bmcmachines",
    kind: "BMCMachine",
    namespaced: true,
};

/// Our `MetalNetworkProfile` (a machine's per-port networking).
pub const NETWORK_PROFILES: Resource = Resource {
    group: GROUP,
    version: VERSION,
    plural: "metalnetworkprofiles",
    kind: "MetalNetworkProfile",
    namespaced: true,
};

/// Every (API group, resource, verb) the code uses: what the ClusterRole in
/// `deploy/rbac.yaml` must grant, no more.
pub const USED_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("ipam.cluster.x-k8s.io", "ipaddressclaims", "get"),
    ("ipam.cluster.x-k8s.io", "ipaddressclaims", "list"),
    ("ipam.cluster.x-k8s.io", "ipaddressclaims", "patch"),
    ("ipam.cluster.x-k8s.io", "ipaddressclaims", "create"),
    ("ipam.cluster.x-k8s.io", "ipaddressclaims", "delete"),
    ("ipam.cluster.x-k8s.io", "ipaddressclaims/status", "patch"),
    ("ipam.cluster.x-k8s.io", "ipaddresses", "get"),
    ("ipam.cluster.x-k8s.io", "ipaddresses", "list"),
    ("ipam.cluster.x-k8s.io", "ipaddresses", "create"),
    ("ipam.cluster.x-k8s.io", "ipaddresses", "patch"),
    ("ipam.cluster.x-k8s.io", "ipaddresses", "delete"),
    ("cluster.x-k8s.io", "clusters", "get"),
    ("cluster.x-k8s.io", "machines", "get"),
    ("cluster.x-k8s.io", "machines", "list"),
    ("infrastructure.cluster.x-k8s.io", "packetmachines", "get"),
    ("infrastructure.cluster.x-k8s.io", "packetmachines", "list"),
    ("infrastructure.cluster.x-k8s.io", "bmcmachines", "get"),
    ("ipam.metal-ipam.dev", "metalippools", "get"),
    ("ipam.metal-ipam.dev", "metalippools", "list"),
    ("ipam.metal-ipam.dev", "metalippools", "patch"),
    ("ipam.metal-ipam.dev", "metalippools/status", "patch"),
    ("ipam.metal-ipam.dev", "globalmetalippools", "get"),
    ("ipam.metal-ipam.dev", "globalmetalippools", "list"),
    ("ipam.metal-ipam.dev", "globalmetalippools", "patch"),
    ("ipam.metal-ipam.dev", "globalmetalippools/status", "patch"),
    ("ipam.metal-ipam.dev", "metalprefixpools", "get"),
    ("ipam.metal-ipam.dev", "metalprefixpools", "list"),
    ("ipam.metal-ipam.dev", "metalprefixpools", "patch"),
    ("ipam.metal-ipam.dev", "metalprefixpools/status", "patch"),
    ("ipam.metal-ipam.dev", "globalmetalprefixpools", "get"),
    ("ipam.metal-ipam.dev", "globalmetalprefixpools", "list"),
    ("ipam.metal-ipam.dev", "globalmetalprefixpools", "patch"),
    (
        "ipam.metal-ipam.dev",
        "globalmetalprefixpools/status",
        "patch",
    ),
    ("ipam.metal-ipam.dev", "metalnetworkprofiles", "get"),
    ("ipam.metal-ipam.dev", "metalnetworkprofiles", "list"),
    // A takeover of the in-cluster provider's pools (capi::takeover).
    ("ipam.cluster.x-k8s.io", "inclusterippools", "get"),
    ("ipam.cluster.x-k8s.io", "inclusterippools", "list"),
    ("ipam.cluster.x-k8s.io", "inclusterippools", "patch"),
    ("ipam.cluster.x-k8s.io", "inclusterippools/status", "patch"),
    ("ipam.cluster.x-k8s.io", "globalinclusterippools", "get"),
    ("ipam.cluster.x-k8s.io", "globalinclusterippools", "list"),
    ("ipam.cluster.x-k8s.io", "globalinclusterippools", "patch"),
    (
        "ipam.cluster.x-k8s.io",
        "globalinclusterippools/status",
        "patch",
    ),
    ("ipam.cluster.x-k8s.io", "inclusterprefixpools", "get"),
    ("ipam.cluster.x-k8s.io", "inclusterprefixpools", "list"),
    ("ipam.cluster.x-k8s.io", "inclusterprefixpools", "patch"),
    (
        "ipam.cluster.x-k8s.io",
        "inclusterprefixpools/status",
        "patch",
    ),
    ("ipam.cluster.x-k8s.io", "globalinclusterprefixpools", "get"),
    (
        "ipam.cluster.x-k8s.io",
        "globalinclusterprefixpools",
        "list",
    ),
    (
        "ipam.cluster.x-k8s.io",
        "globalinclusterprefixpools",
        "patch",
    ),
    (
        "ipam.cluster.x-k8s.io",
        "globalinclusterprefixpools/status",
        "patch",
    ),
    ("apps", "deployments", "get"),
];

/// Page size asked for when listing.
pub const LIST_PAGE: u32 = 250;

/// What went wrong talking to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeError {
    /// 409: the object changed (resourceVersion) or already exists.
    Conflict(String),
    /// 404 on a write (the object vanished).
    NotFound(String),
    /// 410: a list continuation expired.
    Gone(String),
    /// 422/400: the API server rejected what we sent — a bug on our side.
    Rejected(String),
    /// 401/403: credentials or RBAC.
    Forbidden(String),
    /// 429, 5xx, a timeout or a connection that could not be made or
    /// broke: retry later.
    Unavailable(String),
    /// The TLS connection failed (the API server's certificate is not
    /// trusted or invalid, or a TLS protocol error): a configuration
    /// problem, not an outage.
    Tls(String),
    /// The runtime refused the request (`allowed_outbound_hosts`, a bad
    /// `k8s_api_url`).
    Denied(String),
}

impl From<KubeError> for Error {
    fn from(e: KubeError) -> Self {
        match e {
            KubeError::Conflict(m) => Error::new(
                ErrorKind::Transient,
                Known::KubeConflict.as_str(),
                "the object changed concurrently; retry",
            )
            .with_detail(m),
            KubeError::NotFound(m) => Error::new(
                ErrorKind::Transient,
                Known::KubeNotFound.as_str(),
                "an object vanished concurrently; retry",
            )
            .with_detail(m),
            KubeError::Gone(m) => Error::new(
                ErrorKind::Transient,
                "KubeGone",
                "a list continuation expired; retry",
            )
            .with_detail(m),
            KubeError::Rejected(m) => Error::new(
                ErrorKind::Internal,
                "KubeRejected",
                "the Kubernetes API rejected an object metal-ipam wrote",
            )
            .with_detail(m),
            KubeError::Forbidden(m) => Error::new(
                ErrorKind::Internal,
                "KubeForbidden",
                "the Kubernetes API refused the credentials or permissions (k8s_token, RBAC)",
            )
            .with_detail(m),
            KubeError::Unavailable(m) => Error::new(
                ErrorKind::Transient,
                "KubeUnavailable",
                "the Kubernetes API is unavailable; retry",
            )
            .with_detail(m),
            KubeError::Tls(m) => Error::new(
                ErrorKind::Internal,
                "KubeTlsFailed",
                "the TLS connection to the Kubernetes API failed (its certificate is not trusted or invalid, or a TLS protocol error): check k8s_api_url and the component's client TLS settings (CA); retrying does not help",
            )
            .with_detail(m),
            KubeError::Denied(m) => Error::new(
                ErrorKind::Internal,
                "KubeDenied",
                "the runtime refused the request to the Kubernetes API: check k8s_api_url and the component's allowed_outbound_hosts",
            )
            .with_detail(m),
        }
    }
}

/// Where the API server is and how to authenticate.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeConfig {
    /// Base URL, e.g. `https://kubernetes.default.svc` (no trailing slash).
    pub base_url: String,
    /// Bearer token (a ServiceAccount token). Never logged.
    pub token: String,
}

impl std::fmt::Debug for KubeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// The client: configuration plus transport, counting its requests.
pub struct Kube<'a, H: HttpClient + ?Sized> {
    http: &'a H,
    cfg: &'a KubeConfig,
    calls: std::cell::Cell<u32>,
}

/// Merge-patch content type.
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// The query every write carries: a field the object's schema does not
/// know is refused (422) instead of silently dropped. A real API server's
/// default (`Warn`) prunes it and says so only in a `Warning` header, so a
/// field our code writes that an installed CRD lacks (a CAPI version skew,
/// a typo) would be lost without an error; FakeKube has always refused
/// them, and now a real server does too (found on kube-apiserver v1.36.2).
pub const STRICT: &str = "?fieldValidation=Strict";

impl<'a, H: HttpClient + ?Sized> Kube<'a, H> {
    /// A client for `cfg` over `http`.
    pub fn new(http: &'a H, cfg: &'a KubeConfig) -> Self {
        Kube {
            http,
            cfg,
            calls: std::cell::Cell::new(0),
        }
    }

    /// How many requests this client sent.
    pub fn calls(&self) -> u32 {
        self.calls.get()
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value), KubeError> {
        let url = format!("{}{}", self.cfg.base_url.trim_end_matches('/'), path);
        let mut b = http::Request::builder()
            .method(method)
            .uri(&url)
            .header(headers::AUTHORIZATION, format!("Bearer {}", self.cfg.token))
            .header(headers::ACCEPT, "application/json");
        if let Some(ct) = content_type {
            b = b.header(headers::CONTENT_TYPE, ct);
        }
        let bytes = body
            .map(|v| serde_json::to_vec(v).unwrap_or_default())
            .unwrap_or_default();
        let mut req = b.body(bytes).map_err(|e| {
            KubeError::Rejected(format!("{method} {path}: cannot build request: {e}"))
        })?;
        DEADLINE.set(&mut req);
        self.calls.set(self.calls.get() + 1);
        let resp = self.http.send(req).map_err(|e| {
            let m = format!("{method} {path}: {e}");
            match e.kind {
                TransportKind::Tls => KubeError::Tls(m),
                TransportKind::Denied => KubeError::Denied(m),
                _ => KubeError::Unavailable(m),
            }
        })?;
        let status = resp.status().as_u16();
        let body: Value = serde_json::from_slice(resp.body()).unwrap_or(Value::Null);
        let msg = || {
            format!(
                "{method} {path}: {status} {}",
                body.get("message").and_then(Value::as_str).unwrap_or("")
            )
        };
        match status {
            200..=299 => Ok((status, body)),
            404 => Err(KubeError::NotFound(msg())),
            409 => Err(KubeError::Conflict(msg())),
            410 => Err(KubeError::Gone(msg())),
            401 | 403 => Err(KubeError::Forbidden(msg())),
            400 | 415 | 422 => Err(KubeError::Rejected(msg())),
            _ => Err(KubeError::Unavailable(msg())),
        }
    }

    /// GETs one object; `None` if it does not exist.
    ///
    /// # Errors
    /// Anything but 200/404.
    pub fn get(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, KubeError> {
        match self.send("GET", &path(r, ns, Some(name)), None, None) {
            Ok((_, v)) => Ok(Some(v)),
            Err(KubeError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// GETs one object as a typed view; `None` if it does not exist.
    ///
    /// # Errors
    /// As [`Kube::get`].
    pub fn get_as<T: Object>(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<T>, KubeError> {
        Ok(self.get(r, ns, name)?.map(|v| T::from_json(&v)))
    }

    /// Lists every object (all namespaces when `ns` is `None` for a
    /// namespaced kind), following `continue` tokens. An expired token
    /// restarts the listing once.
    ///
    /// # Errors
    /// Anything but 200; a second expiry.
    pub fn list(&self, r: &Resource, ns: Option<&str>) -> Result<Vec<Value>, KubeError> {
        self.list_selected(r, ns, None)
    }

    /// [`Kube::list`] of the objects matching a `labelSelector` (`None`:
    /// every object).
    ///
    /// # Errors
    /// As [`Kube::list`].
    pub fn list_selected(
        &self,
        r: &Resource,
        ns: Option<&str>,
        selector: Option<&str>,
    ) -> Result<Vec<Value>, KubeError> {
        let mut base = format!("{}?limit={LIST_PAGE}", path(r, ns, None));
        if let Some(s) = selector {
            base.push_str("&labelSelector=");
            base.push_str(&percent_encode(s));
        }
        let mut restarted = false;
        'outer: loop {
            let mut items = Vec::new();
            let mut cont: Option<String> = None;
            loop {
                let mut p = base.clone();
                if let Some(c) = &cont {
                    p.push_str("&continue=");
                    p.push_str(&percent_encode(c));
                }
                let (_, page) = match self.send("GET", &p, None, None) {
                    Ok(v) => v,
                    Err(KubeError::Gone(_)) if !restarted => {
                        restarted = true;
                        continue 'outer;
                    }
                    Err(e) => return Err(e),
                };
                if let Some(a) = page.get("items").and_then(Value::as_array) {
                    items.extend(a.iter().cloned());
                }
                cont = page
                    .pointer("/metadata/continue")
                    .and_then(Value::as_str)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string);
                if cont.is_none() {
                    return Ok(items);
                }
            }
        }
    }

    /// Lists every object as typed views (see [`Kube::list`]).
    ///
    /// # Errors
    /// As [`Kube::list`].
    pub fn list_as<T: Object>(&self, r: &Resource, ns: Option<&str>) -> Result<Vec<T>, KubeError> {
        Ok(self.list(r, ns)?.iter().map(T::from_json).collect())
    }

    /// [`Kube::list_selected`] as typed views.
    ///
    /// # Errors
    /// As [`Kube::list`].
    pub fn list_as_selected<T: Object>(
        &self,
        r: &Resource,
        ns: Option<&str>,
        selector: Option<&str>,
    ) -> Result<Vec<T>, KubeError> {
        Ok(self
            .list_selected(r, ns, selector)?
            .iter()
            .map(T::from_json)
            .collect())
    }

    /// Creates an object. Sent with `fieldValidation=Strict` (see
    /// [`STRICT`]).
    ///
    /// # Errors
    /// 409 (already exists) as [`KubeError::Conflict`], others as mapped;
    /// a field the CRD does not know is a 422.
    pub fn create(&self, r: &Resource, ns: Option<&str>, obj: &Value) -> Result<Value, KubeError> {
        self.send(
            "POST",
            &format!("{}{STRICT}", path(r, ns, None)),
            Some("application/json"),
            Some(obj),
        )
        .map(|(_, v)| v)
    }

    /// Applies a JSON merge patch to the object (or to its `/status`), with
    /// `fieldValidation=Strict` (see [`STRICT`]).
    ///
    /// # Errors
    /// 409 when a `metadata.resourceVersion` in the patch is stale; 404 when
    /// the object is gone; 422 for a field the CRD does not know.
    pub fn merge_patch(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        status: bool,
        patch: &Value,
    ) -> Result<Value, KubeError> {
        let mut p = path(r, ns, Some(name));
        if status {
            p.push_str("/status");
        }
        p.push_str(STRICT);
        self.send("PATCH", &p, Some(MERGE_PATCH), Some(patch))
            .map(|(_, v)| v)
    }

    /// Deletes an object; `false` if it was already gone.
    ///
    /// # Errors
    /// Anything but 200/202/404.
    pub fn delete(&self, r: &Resource, ns: Option<&str>, name: &str) -> Result<bool, KubeError> {
        match self.send("DELETE", &path(r, ns, Some(name)), None, None) {
            Ok(_) => Ok(true),
            Err(KubeError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The URL path of an object (or, with `name = None`, its collection);
/// `ns = None` for a namespaced kind is the all-namespaces collection.
///
/// # Examples
/// ```
/// use metal_ipam_core::kube::{path, CLAIMS, GLOBAL_METAL_IP_POOLS};
/// assert_eq!(path(&CLAIMS, Some("ns"), Some("c")), "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns/ipaddressclaims/c");
/// assert_eq!(path(&CLAIMS, None, None), "/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddressclaims");
/// assert_eq!(path(&GLOBAL_METAL_IP_POOLS, None, Some("g")), "/apis/ipam.metal-ipam.dev/v1alpha1/globalmetalippools/g");
/// ```
pub fn path(r: &Resource, ns: Option<&str>, name: Option<&str>) -> String {
    let mut p = format!("/apis/{}/{}", r.group, r.version);
    if let (true, Some(ns)) = (r.namespaced, ns) {
        p.push_str("/namespaces/");
        p.push_str(ns);
    }
    p.push('/');
    p.push_str(r.plural);
    if let Some(n) = name {
        p.push('/');
        p.push_str(n);
    }
    p
}

/// A path segment as the API server reads it: everything but
/// `A-Z a-z 0-9 - _ . ~` escaped.
fn percent_encode(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(s, SEGMENT).to_string()
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::{Reply, ScriptedHttp};

    fn cfg() -> KubeConfig {
        KubeConfig {
            base_url: "https://kube.test".into(),
            token: "t".into(),
        }
    }

    #[test]
    fn every_request_carries_the_deadline() {
        let http = ScriptedHttp::new(vec![(
            "GET /api/v1/namespaces/a",
            Reply::json(200, serde_json::json!({})),
        )]);
        let cfg = cfg();
        let kube = Kube::new(&http, &cfg);
        kube.send("GET", "/api/v1/namespaces/a", None, None)
            .unwrap();
        assert_eq!(http.sent()[0].deadline, DEADLINE);
    }

    #[test]
    fn a_certificate_problem_says_so_and_is_not_an_outage() {
        let cases = [
            (TransportKind::Tls, 500, "KubeTlsFailed"),
            (TransportKind::Denied, 500, "KubeDenied"),
            (TransportKind::Timeout, 503, "KubeUnavailable"),
            (TransportKind::Unreachable, 503, "KubeUnavailable"),
            (TransportKind::Dropped, 503, "KubeUnavailable"),
        ];
        for (kind, status, reason) in cases {
            let http = ScriptedHttp::new(vec![("GET /x", Reply::failed(kind))]);
            let cfg = cfg();
            let kube = Kube::new(&http, &cfg);
            let e = Error::from(kube.send("GET", "/x", None, None).unwrap_err());
            assert_eq!((e.status(), e.reason()), (status, reason), "{kind:?}");
            if kind == TransportKind::Tls {
                assert!(e.message().contains("certificate"), "{}", e.message());
                assert!(!e.message().ends_with("; retry"), "{}", e.message());
            }
        }
    }
}
