//! The custom resources the control plane gets, and their API paths.
//!
//! The same kinds and versions FakeKube serves (checked by a unit test
//! against [`FakeKube::path`](crate::fake_kube::FakeKube::path)): every CRD
//! in `deploy/crds/` at its storage version, CAPI's `IPAddressClaim` and
//! `IPAddress` from `tests/fixtures/crds/` at v1beta2, the in-cluster IPAM
//! provider's four pool kinds from there at v1alpha2, and minimal CRDs made
//! here for `Cluster`, `Machine` (v1beta2) and `PacketMachine` (v1beta1),
//! whose `spec` and `status` keep any field.

use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::fake_kube::{CLUSTER_GROUP, INFRA_GROUP, IN_CLUSTER_CRDS};
use crate::schema::{capi_crds_dir, load_crd, repo_root, Crd, Scope};

const CLAIMS_CRD: &str =
    "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddressclaims.yaml";
const ADDRESSES_CRD: &str =
    "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddresses.yaml";

/// One installed kind.
#[derive(Debug, Clone)]
pub(crate) struct Kind {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    /// Whether it has the status subresource.
    pub status: bool,
    /// The CustomResourceDefinition to POST.
    pub crd: Value,
}

impl Kind {
    fn new(crd: &Crd, version: &str) -> Kind {
        let v = crd
            .version(version)
            .unwrap_or_else(|| panic!("{} has no version {version}", crd.name()));
        Kind {
            group: crd.group().to_owned(),
            version: version.to_owned(),
            plural: crd.plural().to_owned(),
            kind: crd.kind().to_owned(),
            namespaced: crd.scope() == Scope::Namespaced,
            status: v.status_subresource,
            crd: crd.raw().clone(),
        }
    }

    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// `plural.group`, the CRD's name.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The path of a collection (`name: None`) or object; `namespace` is
    /// ignored for cluster-scoped kinds, `None` for a namespaced kind gives
    /// the all-namespaces path.
    pub fn path(&self, namespace: Option<&str>, name: Option<&str>) -> String {
        let mut path = format!("/apis/{}/{}", self.group, self.version);
        if let (true, Some(ns)) = (self.namespaced, namespace) {
            path.push_str("/namespaces/");
            path.push_str(ns);
        }
        path.push('/');
        path.push_str(&self.plural);
        if let Some(name) = name {
            path.push('/');
            path.push_str(name);
        }
        path
    }
}

/// A CRD with no schema to speak of: `spec` and `status` keep any field.
fn minimal_crd(group: &str, version: &str, plural: &str, kind: &str) -> Crd {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let doc = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_ascii_lowercase(),
            },
            "scope": "Namespaced",
            "versions": [{
                "name": version,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": open, "status": open},
                }},
            }],
        },
    });
    Crd::from_value(doc).expect("a well-formed minimal CRD")
}

/// Every installed kind, loaded once per process.
///
/// # Panics
/// If a CRD file cannot be read or parsed.
pub(crate) fn kinds() -> &'static [Kind] {
    static KINDS: OnceLock<Vec<Kind>> = OnceLock::new();
    KINDS.get_or_init(|| {
        let load = |path: std::path::PathBuf| {
            load_crd(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
        };
        let mut kinds = Vec::new();
        let reference = capi_crds_dir();
        kinds.push(Kind::new(&load(reference.join(CLAIMS_CRD)), "v1beta2"));
        kinds.push(Kind::new(&load(reference.join(ADDRESSES_CRD)), "v1beta2"));
        for file in IN_CLUSTER_CRDS {
            kinds.push(Kind::new(&load(reference.join(file)), "v1alpha2"));
        }
        let ours = repo_root().join("deploy/crds");
        let mut files: Vec<_> = std::fs::read_dir(&ours)
            .unwrap_or_else(|e| panic!("{}: {e}", ours.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        for file in files {
            let crd = load(file);
            let version = crd.storage_version().to_owned();
            kinds.push(Kind::new(&crd, &version));
        }
        // No status subresource is asked of PacketMachine, but FakeKube
        // serves it with one (as CAPP's CRD has), and so do we.
        for (group, version, plural, kind) in [
            (CLUSTER_GROUP, "v1beta2", "clusters", "Cluster"),
            (CLUSTER_GROUP, "v1beta2", "machines", "Machine"),
            (INFRA_GROUP, "v1beta1", "packetmachines", "PacketMachine"),
        ] {
            kinds.push(Kind::new(
                &minimal_crd(group, version, plural, kind),
                version,
            ));
        }
        kinds
    })
}

/// The kind with this group and plural.
pub(crate) fn by_plural(group: &str, plural: &str) -> Option<&'static Kind> {
    kinds()
        .iter()
        .find(|k| k.group == group && k.plural == plural)
}

/// The kind an object's `apiVersion` and `kind` name.
pub(crate) fn by_object(obj: &Value) -> Option<&'static Kind> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str)?;
    let kind = obj.get("kind").and_then(Value::as_str)?;
    kinds()
        .iter()
        .find(|k| k.api_version() == api_version && k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_kube::{FakeKube, IPAM_GROUP, METAL_GROUP};

    #[test]
    fn paths_match_fake_kube() {
        for k in kinds() {
            for ns in [None, Some("default")] {
                for name in [None, Some("a")] {
                    assert_eq!(
                        k.path(ns, name),
                        FakeKube::path(&k.group, &k.plural, ns, name),
                        "{}",
                        k.crd_name()
                    );
                }
            }
        }
    }

    #[test]
    fn every_kind_fake_kube_serves_is_installed() {
        for (group, plural, status) in [
            (IPAM_GROUP, "ipaddressclaims", true),
            (IPAM_GROUP, "ipaddresses", false),
            (METAL_GROUP, "metalippools", true),
            (METAL_GROUP, "globalmetalippools", true),
            (METAL_GROUP, "metalprefixpools", true),
            (METAL_GROUP, "globalmetalprefixpools", true),
            (METAL_GROUP, "metalnetworkprofiles", false),
            (IPAM_GROUP, "inclusterippools", true),
            (IPAM_GROUP, "globalinclusterippools", true),
            (IPAM_GROUP, "inclusterprefixpools", true),
            (IPAM_GROUP, "globalinclusterprefixpools", true),
            (CLUSTER_GROUP, "clusters", true),
            (CLUSTER_GROUP, "machines", true),
            (INFRA_GROUP, "packetmachines", true),
        ] {
            let k = by_plural(group, plural).unwrap_or_else(|| panic!("{plural}.{group}"));
            assert_eq!(k.status, status, "{plural}.{group} status subresource");
        }
        assert_eq!(kinds().len(), 14);
        let claim =
            json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim"});
        assert_eq!(
            by_object(&claim).map(|k| k.plural.as_str()),
            Some("ipaddressclaims")
        );
        let old = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim"});
        assert!(by_object(&old).is_none());
    }
}
