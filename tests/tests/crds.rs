//! The CRDs: the Cluster API ones we answer to (vendored in tests/fixtures/crds/),
//! our own pool CRDs (deploy/crds/: address pools and prefix pools) and the
//! examples (deploy/examples/), checked with the schema validator in
//! `metal_ipam_tests::schema`. The validator does not evaluate CEL rules
//! (`x-kubernetes-validations`): for those, only their text is checked here.

use std::path::PathBuf;

use metal_ipam_tests::schema::{capi_crds_dir, load_crd, load_yaml, repo_root, Crd, Scope};
use serde_json::{json, Value};

const CLAIMS: &str =
    "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddressclaims.yaml";
const ADDRESSES: &str = "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddresses.yaml";
const IN_CLUSTER_POOLS: &str =
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_inclusterippools.yaml";
const IN_CLUSTER_PREFIX_POOLS: &str =
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_inclusterprefixpools.yaml";

const OUR_GROUP: &str = "ipam.metal-ipam.dev";

fn capi_dir() -> PathBuf {
    capi_crds_dir()
}

fn capi_crd(file: &str) -> Crd {
    load_crd(capi_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e:#}"))
}

fn our_crd(plural: &str) -> Crd {
    let path = repo_root().join(format!("deploy/crds/{OUR_GROUP}_{plural}.yaml"));
    load_crd(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

fn example(name: &str) -> Value {
    let path = repo_root().join("deploy/examples").join(name);
    load_yaml(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// The distinct error paths of a validation result; empty when it passed.
fn error_paths(result: Result<(), Vec<metal_ipam_tests::schema::SchemaError>>) -> Vec<String> {
    match result {
        Ok(()) => Vec::new(),
        Err(errors) => {
            let mut paths: Vec<String> = errors.into_iter().map(|e| e.path).collect();
            paths.dedup(); // sorted by path; one field may break several rules
            paths
        }
    }
}

/// Validates `object` with `crd` and asserts it passes, printing the errors if not.
fn assert_valid(crd: &Crd, object: &Value) {
    if let Err(errors) = crd.validate(object) {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        panic!(
            "{} rejected a valid object:\n  {}\nobject: {object:#}",
            crd.name(),
            lines.join("\n  ")
        );
    }
}

/// Applies `edit` to a copy of `object` and asserts that `crd` rejects it
/// with errors at exactly `paths`.
fn assert_rejected(crd: &Crd, object: &Value, edit: impl FnOnce(&mut Value), paths: &[&str]) {
    let mut broken = object.clone();
    edit(&mut broken);
    let result = crd.validate(&broken);
    let message = format!("{result:?}");
    assert_eq!(
        error_paths(result),
        paths,
        "{}: wrong errors for {broken:#}\n{message}",
        crd.name()
    );
}

/// An edit that sets the field at a JSON pointer, adding it if its parent
/// object exists but the field does not.
fn set(pointer: &'static str, value: Value) -> impl FnOnce(&mut Value) {
    move |object: &mut Value| {
        if let Some(slot) = object.pointer_mut(pointer) {
            *slot = value;
            return;
        }
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        object
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no object at {parent:?} to add {key} to"))
            .insert(key.to_owned(), value);
    }
}

/// An edit that removes the field at a JSON pointer, which must exist.
fn remove(pointer: &'static str) -> impl FnOnce(&mut Value) {
    move |object: &mut Value| {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let removed = object
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .and_then(|map| map.remove(key));
        assert!(removed.is_some(), "no {pointer} in the object");
    }
}

// ---------------------------------------------------------------------------
// The Cluster API reference CRDs
// ---------------------------------------------------------------------------

#[test]
fn every_reference_crd_loads_and_is_structural() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(capi_dir())
        .expect("tests/fixtures/crds is readable")
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        7,
        "expected the 7 reference CRDs, found {files:?}"
    );
    for file in &files {
        let crd = load_crd(file).unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
        assert_eq!(
            crd.name(),
            format!("{}.{}", crd.plural(), crd.group()),
            "{}",
            file.display()
        );
        assert!(!crd.served_versions().is_empty());
        for version in crd.versions() {
            let problems = version.schema.structural_errors();
            assert!(
                problems.is_empty(),
                "{} {}: {problems:?}",
                crd.name(),
                version.name
            );
        }
    }
}

#[test]
fn capi_claim_and_address_crds_match_the_contract_notes() {
    let claims = capi_crd(CLAIMS);
    assert_eq!(claims.group(), "ipam.cluster.x-k8s.io");
    assert_eq!(claims.kind(), "IPAddressClaim");
    assert_eq!(claims.scope(), Scope::Namespaced);
    assert_eq!(claims.categories(), ["cluster-api"]);
    assert_eq!(claims.served_versions(), ["v1alpha1", "v1beta1", "v1beta2"]);
    assert_eq!(claims.storage_version(), "v1beta2");
    assert!(claims.version("v1beta1").unwrap().deprecated);
    assert!(claims.versions().iter().all(|v| v.status_subresource));

    let addresses = capi_crd(ADDRESSES);
    assert_eq!(addresses.kind(), "IPAddress");
    assert_eq!(addresses.storage_version(), "v1beta2");
    assert!(
        addresses.versions().iter().all(|v| !v.status_subresource),
        "IPAddress has no status"
    );
    let prefix = addresses
        .schema_for("v1beta2")
        .unwrap()
        .at("spec.prefix")
        .unwrap();
    assert_eq!(prefix["format"], "int32");
    assert_eq!(prefix["maximum"], 128);
}

fn ip_address_v1beta2() -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddress",
        "metadata": {
            "name": "web-cp-0",
            "namespace": "default",
            "labels": {"cluster.x-k8s.io/cluster-name": "web"},
            "finalizers": ["ipam.cluster.x-k8s.io/ProtectAddress"],
            "ownerReferences": [{
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
                "name": "web-cp-0", "uid": "123e4567-e89b-12d3-a456-426614174000",
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "address": "192.0.2.20",
            "prefix": 24,
            "gateway": "192.0.2.1",
            "claimRef": {"name": "web-cp-0"},
            "poolRef": {"apiGroup": OUR_GROUP, "kind": "MetalIPPool", "name": "web-v4"}
        }
    })
}

#[test]
fn ip_address_v1beta2_objects_are_checked_field_by_field() {
    let crd = capi_crd(ADDRESSES);
    let good = ip_address_v1beta2();
    assert_valid(&crd, &good);
    // The longest textual IPv6 address (39 characters) fits.
    let mut v6 = good.clone();
    v6["spec"]["address"] = json!("2001:0db8:0000:0000:0000:0000:0000:0001");
    v6["spec"]["prefix"] = json!(128);
    assert_valid(&crd, &v6);

    assert_rejected(&crd, &good, remove("/spec/prefix"), &["spec.prefix"]);
    assert_rejected(
        &crd,
        &good,
        set("/spec/prefix", json!(200)),
        &["spec.prefix"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/prefix", json!(-1)),
        &["spec.prefix"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/prefix", json!("24")),
        &["spec.prefix"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/poolRef/kind", json!("Metal_IPPool")),
        &["spec.poolRef.kind"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/poolRef/kind", json!("1MetalIPPool")),
        &["spec.poolRef.kind"],
    );
    assert_rejected(
        &crd,
        &good,
        remove("/spec/poolRef/apiGroup"),
        &["spec.poolRef.apiGroup"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/poolRef/name", json!("Web_V4")),
        &["spec.poolRef.name"],
    );
    assert_rejected(
        &crd,
        &good,
        set(
            "/spec/address",
            json!("2001:0db8:0000:0000:0000:0000:0000:0001/128"),
        ),
        &["spec.address"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/gateway", json!("")),
        &["spec.gateway"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/claimRef", json!({})),
        &["spec.claimRef.name"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/dnsServers", json!(["192.0.2.53"])),
        &["spec.dnsServers"],
    );
    // IPAddress has no status at all.
    assert_rejected(&crd, &good, set("/status", json!({})), &["status"]);
    assert_rejected(&crd, &good, remove("/spec"), &["spec"]);
    // Several problems are all reported.
    assert_rejected(
        &crd,
        &good,
        |o| {
            o["spec"]["prefix"] = json!(129);
            o["spec"]["poolRef"]["kind"] = json!("-bad");
            o["spec"].as_object_mut().unwrap().remove("address");
        },
        &["spec.address", "spec.poolRef.kind", "spec.prefix"],
    );
}

#[test]
fn ip_address_v1beta1_has_looser_rules() {
    let crd = capi_crd(ADDRESSES);
    let mut good = ip_address_v1beta2();
    good["apiVersion"] = json!("ipam.cluster.x-k8s.io/v1beta1");
    assert_valid(&crd, &good);
    // apiGroup is optional and prefix unbounded in v1beta1 …
    let mut loose = good.clone();
    loose["spec"]["poolRef"]
        .as_object_mut()
        .unwrap()
        .remove("apiGroup");
    loose["spec"]["prefix"] = json!(200);
    assert_valid(&crd, &loose);
    // … but the four fields are still required.
    assert_rejected(&crd, &good, remove("/spec/prefix"), &["spec.prefix"]);
    assert_rejected(&crd, &good, remove("/spec/claimRef"), &["spec.claimRef"]);
    assert_rejected(
        &crd,
        &good,
        remove("/spec/poolRef/kind"),
        &["spec.poolRef.kind"],
    );
    assert_rejected(&crd, &good, set("/spec/extra", json!(1)), &["spec.extra"]);
}

fn claim_v1beta2() -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": "web-cp-0", "namespace": "default",
                     "finalizers": ["ipam.metal-ipam.dev/release-address"]},
        "spec": {
            "clusterName": "web",
            "poolRef": {"apiGroup": OUR_GROUP, "kind": "MetalIPPool", "name": "web-v4"}
        },
        "status": {
            "addressRef": {"name": "web-cp-0"},
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "AddressAllocated",
                "message": "", "lastTransitionTime": "2026-11-29T18:17:07Z",
                "observedGeneration": 1
            }]
        }
    })
}

#[test]
fn ip_address_claim_v1beta2_spec_and_status() {
    let crd = capi_crd(CLAIMS);
    let good = claim_v1beta2();
    assert_valid(&crd, &good);
    let mut unbound = good.clone();
    unbound.as_object_mut().unwrap().remove("status");
    assert_valid(&crd, &unbound);

    assert_rejected(&crd, &good, remove("/spec/poolRef"), &["spec.poolRef"]);
    assert_rejected(
        &crd,
        &good,
        set("/spec/poolRef/kind", json!("Metal IPPool")),
        &["spec.poolRef.kind"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/spec/clusterName", json!("c".repeat(64))),
        &["spec.clusterName"],
    );
    // status needs at least one property when present.
    assert_rejected(&crd, &good, set("/status", json!({})), &["status"]);
    assert_rejected(
        &crd,
        &good,
        set("/status/addressRef", json!({})),
        &["status.addressRef.name"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/status/conditions/0/status", json!("Maybe")),
        &["status.conditions[0].status"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/status/conditions/0/reason", json!("")),
        &["status.conditions[0].reason"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/status/conditions/0/reason", json!("Pool exhausted")),
        &["status.conditions[0].reason"],
    );
    assert_rejected(
        &crd,
        &good,
        remove("/status/conditions/0/message"),
        &["status.conditions[0].message"],
    );
    assert_rejected(
        &crd,
        &good,
        set(
            "/status/conditions/0/lastTransitionTime",
            json!("yesterday"),
        ),
        &["status.conditions[0].lastTransitionTime"],
    );
    assert_rejected(
        &crd,
        &good,
        set("/status/conditions/0/observedGeneration", json!(-1)),
        &["status.conditions[0].observedGeneration"],
    );
    // Conditions are a list-map keyed by type.
    assert_rejected(
        &crd,
        &good,
        |o| {
            let ready = o["status"]["conditions"][0].clone();
            o["status"]["conditions"]
                .as_array_mut()
                .unwrap()
                .push(ready);
        },
        &["status.conditions[1]"],
    );
    // v1beta1-style conditions belong under status.deprecated.v1beta1.
    assert_rejected(
        &crd,
        &good,
        set("/status/conditions/0/severity", json!("Error")),
        &["status.conditions[0].severity"],
    );
    let mut deprecated = good.clone();
    deprecated["status"]["deprecated"] = json!({"v1beta1": {"conditions": [{
        "type": "Ready", "status": "False", "severity": "Error",
        "reason": "PoolExhausted", "lastTransitionTime": "2026-11-29T18:17:07Z"}]}});
    assert_valid(&crd, &deprecated);
}

#[test]
fn ip_address_claim_v1beta1_and_served_versions() {
    let crd = capi_crd(CLAIMS);
    let good = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta1",
        "kind": "IPAddressClaim",
        "metadata": {"name": "web-cp-0", "namespace": "default"},
        "spec": {"poolRef": {"kind": "MetalIPPool", "name": "web-v4"}},
        "status": {
            "addressRef": {"name": "web-cp-0"},
            "conditions": [{"type": "Ready", "status": "False", "severity": "Warning",
                            "reason": "PoolExhausted", "message": "no address left",
                            "lastTransitionTime": "2026-11-29T18:17:07Z"}]
        }
    });
    assert_valid(&crd, &good);
    assert_rejected(
        &crd,
        &good,
        remove("/status/conditions/0/lastTransitionTime"),
        &["status.conditions[0].lastTransitionTime"],
    );
    assert_rejected(
        &crd,
        &good,
        remove("/spec/poolRef/name"),
        &["spec.poolRef.name"],
    );
    // Unknown versions and kinds are refused before the schema is consulted.
    assert_rejected(
        &crd,
        &good,
        set("/apiVersion", json!("ipam.cluster.x-k8s.io/v1")),
        &["apiVersion"],
    );
    assert_rejected(&crd, &good, set("/kind", json!("IPAddress")), &["kind"]);
}

// ---------------------------------------------------------------------------
// Our pool CRDs
// ---------------------------------------------------------------------------

const OUR_CRDS: [(&str, &str, Scope); 2] = [
    ("metalippools", "MetalIPPool", Scope::Namespaced),
    ("globalmetalippools", "GlobalMetalIPPool", Scope::Cluster),
];

/// The prefix pool kinds (issue 20): a sub-prefix per claim.
const PREFIX_CRDS: [(&str, &str, Scope); 2] = [
    ("metalprefixpools", "MetalPrefixPool", Scope::Namespaced),
    (
        "globalmetalprefixpools",
        "GlobalMetalPrefixPool",
        Scope::Cluster,
    ),
];

/// Every pool kind: address pools, then prefix pools.
fn all_pool_crds() -> impl Iterator<Item = (&'static str, &'static str, Scope)> {
    OUR_CRDS.into_iter().chain(PREFIX_CRDS)
}

#[test]
fn our_crds_have_the_expected_identity_and_labels() {
    for (plural, kind, scope) in all_pool_crds() {
        let crd = our_crd(plural);
        assert_eq!(crd.name(), format!("{plural}.{OUR_GROUP}"));
        assert_eq!(crd.group(), OUR_GROUP);
        assert_eq!(crd.kind(), kind);
        assert_eq!(crd.list_kind(), Some(format!("{kind}List").as_str()));
        assert_eq!(crd.plural(), plural);
        assert_eq!(crd.singular(), Some(kind.to_lowercase().as_str()));
        assert_eq!(crd.scope(), scope);
        assert_eq!(crd.categories(), ["cluster-api"]);
        assert_eq!(crd.served_versions(), ["v1alpha1"]);
        assert_eq!(crd.storage_version(), "v1alpha1");
        assert!(crd.version("v1alpha1").unwrap().status_subresource);

        let labels: Vec<(&str, &str)> = crd
            .labels()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("cluster.x-k8s.io/provider", "ipam-metal-ipam"),
                ("cluster.x-k8s.io/v1beta2", "v1alpha1"),
                ("clusterctl.cluster.x-k8s.io/move-hierarchy", ""),
            ]
        );
        // Every version named by the contract label is served.
        for version in crd.labels()["cluster.x-k8s.io/v1beta2"].split('_') {
            assert!(crd.served_versions().contains(&version), "{version}");
        }
    }
}

#[test]
fn our_crds_are_structural_and_documented() {
    for (plural, _, _) in all_pool_crds() {
        let crd = our_crd(plural);
        let schema = crd.schema_for("v1alpha1").unwrap();
        assert_eq!(schema.structural_errors(), vec![], "{plural}");
        let mut undocumented = Vec::new();
        find_undocumented(schema, "", &mut undocumented);
        assert_eq!(
            undocumented,
            Vec::<String>::new(),
            "{plural}: fields without description"
        );
    }
}

/// Collects fields (below the root's apiVersion/kind/metadata) that have no
/// description, which `kubectl explain` would show bare.
fn find_undocumented(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(properties) = node.get("properties").and_then(Value::as_object) else {
        if let Some(items) = node.get("items") {
            find_undocumented(items, &format!("{path}[]"), out);
        }
        return;
    };
    for (name, child) in properties {
        if path.is_empty() && name == "metadata" {
            continue;
        }
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let documented = child
            .get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| !d.trim().is_empty());
        if !documented {
            out.push(here.clone());
        }
        find_undocumented(child, &here, out);
    }
}

#[test]
fn both_pool_kinds_share_one_spec_and_status_schema() {
    let namespaced = our_crd("metalippools");
    let global = our_crd("globalmetalippools");
    let (a, b) = (
        namespaced.schema_for("v1alpha1").unwrap(),
        global.schema_for("v1alpha1").unwrap(),
    );
    assert_eq!(a.at("spec"), b.at("spec"));
    assert_eq!(a.at("status"), b.at("status"));
    assert_eq!(
        namespaced.version("v1alpha1").unwrap().printer_columns,
        global.version("v1alpha1").unwrap().printer_columns
    );
}

#[test]
fn our_spec_mirrors_in_cluster_v1alpha2_plus_pre_allocations() {
    let ours = our_crd("metalippools");
    let ours = ours.schema_for("v1alpha1").unwrap();
    let in_cluster = capi_crd(IN_CLUSTER_POOLS);
    let theirs = in_cluster.schema_for("v1alpha2").unwrap();

    let field_names = |schema: &Value| -> Vec<String> {
        schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let mut expected = field_names(theirs.at("spec").unwrap());
    expected.extend(["preAllocations".into(), "metal".into(), "phoenixnap".into()]);
    expected.sort();
    let mut actual = field_names(ours.at("spec").unwrap());
    actual.sort();
    assert_eq!(actual, expected);
    // addresses and prefix are required as in-cluster's, unless the pool is
    // backed by a cloud (its block provides them).
    assert_eq!(ours.at("spec").unwrap().get("required"), None);
    assert_eq!(
        ours.at("spec").unwrap()["anyOf"],
        json!([{"required": ["addresses", "prefix"]}, {"required": ["metal"]}, {"required": ["phoenixnap"]}])
    );
    assert_eq!(
        theirs.at("spec").unwrap()["required"],
        json!(["addresses", "prefix"])
    );
    for field in [
        "spec.addresses",
        "spec.prefix",
        "spec.gateway",
        "spec.excludedAddresses",
        "spec.allocateReservedIPAddresses",
        "spec.addressReuseGracePeriodSeconds",
        "status.ipAddresses.total",
        "status.ipAddresses.free",
        "status.ipAddresses.used",
        "status.ipAddresses.outOfRange",
    ] {
        assert_eq!(
            ours.at(field).unwrap()["type"],
            theirs.at(field).unwrap()["type"],
            "{field}"
        );
    }
    assert_eq!(
        ours.at("status.ipAddresses").unwrap()["required"],
        theirs.at("status.ipAddresses").unwrap()["required"]
    );
    let grace = ours.at("spec.addressReuseGracePeriodSeconds").unwrap();
    assert_eq!(
        (&grace["format"], &grace["minimum"]),
        (&json!("int32"), &json!(0))
    );
    assert_eq!(
        ours.at("spec.preAllocations").unwrap()["additionalProperties"]["type"],
        "string"
    );
    let conditions = ours.at("status.conditions").unwrap();
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    assert_eq!(
        ours.at("status.conditions[].status").unwrap()["enum"],
        json!(["True", "False", "Unknown"])
    );
}

#[test]
fn our_printer_columns_match_in_cluster_plus_age() {
    for (plural, _, _) in OUR_CRDS {
        let crd = our_crd(plural);
        let columns: Vec<(&str, &str, &str)> = crd
            .version("v1alpha1")
            .unwrap()
            .printer_columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Addresses", "string", ".spec.addresses"),
                ("Total", "integer", ".status.ipAddresses.total"),
                ("Free", "integer", ".status.ipAddresses.free"),
                ("Used", "integer", ".status.ipAddresses.used"),
                ("Age", "date", ".metadata.creationTimestamp"),
            ],
            "{plural}"
        );
    }
}

#[test]
fn address_entries_must_look_like_an_ip_a_range_or_a_cidr() {
    let crd = our_crd("metalippools");
    let pool = example("metalippool.yaml");
    for good in [
        "192.0.2.1",
        "192.0.2.10-192.0.2.20",
        "192.0.2.0/24",
        "2001:db8::/64",
        "2001:db8::1-2001:db8::ff",
        "::ffff:192.0.2.1",
    ] {
        let mut p = pool.clone();
        p["spec"]["addresses"] = json!([good]);
        p["spec"]["excludedAddresses"] = json!([good]);
        assert_valid(&crd, &p);
    }
    for bad in [
        "",
        "192.0.2.0/24/8",
        "192.0.2.1 - 192.0.2.9",
        "host.example",
        "192.0.2.0/1000",
    ] {
        assert_rejected(
            &crd,
            &pool,
            set("/spec/addresses/1", json!(bad)),
            &["spec.addresses[1]"],
        );
        assert_rejected(
            &crd,
            &pool,
            set("/spec/excludedAddresses/0", json!(bad)),
            &["spec.excludedAddresses[0]"],
        );
    }
    assert_rejected(
        &crd,
        &pool,
        set("/spec/gateway", json!("192.0.2.0/24")),
        &["spec.gateway"],
    );
}

// ---------------------------------------------------------------------------
// The examples in deploy/examples/
// ---------------------------------------------------------------------------

#[test]
fn examples_validate_against_their_crds() {
    assert_valid(&our_crd("metalippools"), &example("metalippool.yaml"));
    assert_valid(
        &our_crd("globalmetalippools"),
        &example("globalmetalippool.yaml"),
    );
    assert_valid(&capi_crd(CLAIMS), &example("ipaddressclaim.yaml"));
    assert_valid(&our_crd("metalippools"), &example("vrf-metalippool.yaml"));
    assert_valid(
        &our_crd("metalnetworkprofiles"),
        &example("network-profile.yaml"),
    );
    assert_valid(
        &our_crd("metalprefixpools"),
        &example("metalprefixpool.yaml"),
    );
    assert_valid(
        &our_crd("globalmetalprefixpools"),
        &example("globalmetalprefixpool.yaml"),
    );
    assert_valid(
        &our_crd("metalprefixpools"),
        &example("vrf-metalprefixpool.yaml"),
    );
    assert_valid(&capi_crd(CLAIMS), &example("ipaddressclaim-prefix.yaml"));
}

#[test]
fn the_network_profile_example_is_one_metal_ipam_accepts() {
    use metal_ipam_core::network::profile::{Mode, Profile};
    let v = example("network-profile.yaml");
    let p = Profile::from_json(&v["spec"]).unwrap();
    p.validate().unwrap();
    assert_eq!(p.modes()["bond0"], Mode::HybridBonded);
    // Its VLAN pool is the VRF example's, in the same metro.
    let vrf = example("vrf-metalippool.yaml");
    assert_eq!(
        p.ports[0].vlans[0].pool.as_ref().unwrap().name,
        vrf["metadata"]["name"].as_str().unwrap()
    );
    assert_eq!(p.metro.as_deref(), vrf["spec"]["metal"]["metro"].as_str());
    // The schema and the webhook agree on what the schema can say.
    let crd = our_crd("metalnetworkprofiles");
    assert_rejected(
        &crd,
        &v,
        |o: &mut Value| o["spec"]["ports"][0]["name"] = "eth9".into(),
        &["spec.ports[0].name"],
    );
    assert_rejected(
        &crd,
        &v,
        |o: &mut Value| o["spec"]["ports"][0]["vlans"][1]["mtu"] = 9216.into(),
        &["spec.ports[0].vlans[1].mtu"],
    );
    // Its elastic IP comes from the VRF-backed pool; the schema knows the
    // field and refuses what the profile model refuses as unknown.
    assert_eq!(
        p.ports[0].elastic_ips[0].pool.name,
        vrf["metadata"]["name"].as_str().unwrap()
    );
    assert_rejected(
        &crd,
        &v,
        |o: &mut Value| o["spec"]["ports"][0]["elasticIPs"][0]["pool"]["kind"] = "Other".into(),
        &["spec.ports[0].elasticIPs[0].pool.kind"],
    );
}

#[test]
fn the_vrf_example_is_a_pool_metal_ipam_accepts() {
    use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
    let v = example("vrf-metalippool.yaml");
    let object = PoolObject::parse(&PoolId::namespaced("default", "web-vrf"), &v).unwrap();
    let pool = object.spec.validate().unwrap();
    // The block's .0 and .255 are reserved and .1 is the gateway.
    assert_eq!(pool.total(), 253);
    assert_eq!(pool.gateway, Some("10.10.1.1".parse().unwrap()));
    // What the CRD's CEL rule says: without metal, addresses are required.
    let mut plain = v.clone();
    plain["spec"].as_object_mut().unwrap().remove("metal");
    let e = PoolObject::parse(&PoolId::namespaced("default", "web-vrf"), &plain).unwrap_err();
    assert_eq!(e.field(), Some("spec.addresses"));
}

#[test]
fn examples_fit_together() {
    let pool = example("metalippool.yaml");
    let global = example("globalmetalippool.yaml");
    let claim = example("ipaddressclaim.yaml");

    // The namespaced example: IPv4, a range, exclusions and a preAllocation.
    assert!(pool["metadata"]["namespace"].is_string());
    let addresses = pool["spec"]["addresses"].as_array().unwrap();
    assert!(addresses.iter().any(|a| a.as_str().unwrap().contains('-')));
    assert!(!pool["spec"]["excludedAddresses"]
        .as_array()
        .unwrap()
        .is_empty());
    // The global example: cluster-scoped, a whole IPv6 /64.
    assert!(global["metadata"].get("namespace").is_none());
    assert_eq!(global["spec"]["prefix"], 64);
    assert!(global["spec"]["addresses"][0]
        .as_str()
        .unwrap()
        .ends_with("::/64"));

    // The claim points at the namespaced pool, from the pool's namespace …
    assert_eq!(claim["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(
        claim["spec"]["poolRef"],
        json!({"apiGroup": OUR_GROUP, "kind": pool["kind"], "name": pool["metadata"]["name"]})
    );
    assert_eq!(
        claim["metadata"]["namespace"],
        pool["metadata"]["namespace"]
    );
    // … and is the one the pool pre-allocates an address for.
    let name = claim["metadata"]["name"].as_str().unwrap();
    let pre = pool["spec"]["preAllocations"][name].as_str();
    assert_eq!(pre, Some("192.0.2.20"), "preAllocations should pin {name}");
}

#[test]
fn broken_pools_are_rejected_with_the_right_paths() {
    for (plural, file) in [
        ("metalippools", "metalippool.yaml"),
        ("globalmetalippools", "globalmetalippool.yaml"),
    ] {
        let crd = our_crd(plural);
        let pool = example(file);
        assert_valid(&crd, &pool);
        let check = |edit: Box<dyn FnOnce(&mut Value)>, paths: &[&str]| {
            assert_rejected(&crd, &pool, edit, paths)
        };
        // Required unless metal is set: an anyOf, reported on spec.
        check(Box::new(remove("/spec/addresses")), &["spec"]);
        check(
            Box::new(set("/spec/addresses", json!([]))),
            &["spec.addresses"],
        );
        check(Box::new(remove("/spec/prefix")), &["spec"]);
        check(Box::new(set("/spec/prefix", json!(129))), &["spec.prefix"]);
        check(Box::new(set("/spec/prefix", json!(-1))), &["spec.prefix"]);
        check(
            Box::new(set("/spec/addressReuseGracePeriodSeconds", json!(-1))),
            &["spec.addressReuseGracePeriodSeconds"],
        );
        check(
            Box::new(set(
                "/spec/addressReuseGracePeriodSeconds",
                json!(2_147_483_648_i64),
            )),
            &["spec.addressReuseGracePeriodSeconds"],
        );
        check(
            Box::new(set("/spec/allocateReservedIPAddresses", json!("yes"))),
            &["spec.allocateReservedIPAddresses"],
        );
        // in-cluster's v1alpha1 fields are not ours.
        check(
            Box::new(set("/spec/subnet", json!("192.0.2.0/24"))),
            &["spec.subnet"],
        );
        // The README of in-cluster misspells excludedAddresses.
        check(
            Box::new(set("/spec/excludeAddresses", json!(["192.0.2.5"]))),
            &["spec.excludeAddresses"],
        );
        check(
            Box::new(set("/spec/preAllocations", json!({"web-cp-1": 20}))),
            &["spec.preAllocations[web-cp-1]"],
        );
        check(
            Box::new(set(
                "/spec/preAllocations",
                json!({"web-cp-1": "192.0.2.0/24"}),
            )),
            &["spec.preAllocations[web-cp-1]"],
        );
        check(
            Box::new(set("/spec/excludedAddresses", json!("192.0.2.5"))),
            &["spec.excludedAddresses"],
        );
        check(Box::new(set("/unknown", json!(1))), &["unknown"]);
        check(
            Box::new(set("/apiVersion", json!("ipam.metal-ipam.dev/v1alpha2"))),
            &["apiVersion"],
        );
        check(
            Box::new(set("/apiVersion", json!("ipam.cluster.x-k8s.io/v1alpha1"))),
            &["apiVersion"],
        );
    }
}

#[test]
fn pool_status_is_checked_too() {
    let crd = our_crd("globalmetalippools");
    let mut pool = example("globalmetalippool.yaml");
    pool["status"] = json!({
        "ipAddresses": {
            // A /64 has more addresses than an int64 holds: capped.
            "total": i64::MAX, "free": i64::MAX, "used": 1, "outOfRange": 0
        },
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "PoolReady", "message": "",
            "lastTransitionTime": "2026-11-29T18:17:07Z", "observedGeneration": 1
        }]
    });
    assert_valid(&crd, &pool);

    assert_rejected(
        &crd,
        &pool,
        remove("/status/ipAddresses/used"),
        &["status.ipAddresses.used"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/ipAddresses/free", json!(-1)),
        &["status.ipAddresses.free"],
    );
    // 2^64 does not fit: it must be reported capped, not as is.
    assert_rejected(
        &crd,
        &pool,
        set("/status/ipAddresses/total", json!(u64::MAX)),
        &["status.ipAddresses.total"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/conditions/0/status", json!("true")),
        &["status.conditions[0].status"],
    );
    assert_rejected(
        &crd,
        &pool,
        |o| {
            let ready = o["status"]["conditions"][0].clone();
            o["status"]["conditions"]
                .as_array_mut()
                .unwrap()
                .push(ready);
        },
        &["status.conditions[1]"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/ready", json!(true)),
        &["status.ready"],
    );
}

// ---------------------------------------------------------------------------
// The prefix pools (issue 20)
// ---------------------------------------------------------------------------

/// `node` without any `description`, at any depth: what is left of a schema
/// once its documentation is set aside.
fn without_descriptions(node: &Value) -> Value {
    match node {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "description")
                .map(|(k, v)| (k.clone(), without_descriptions(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_descriptions).collect()),
        other => other.clone(),
    }
}

#[test]
fn both_prefix_pool_kinds_share_one_spec_and_status_schema() {
    let namespaced = our_crd("metalprefixpools");
    let global = our_crd("globalmetalprefixpools");
    let (a, b) = (
        namespaced.schema_for("v1alpha1").unwrap(),
        global.schema_for("v1alpha1").unwrap(),
    );
    assert_eq!(a.at("spec"), b.at("spec"));
    assert_eq!(a.at("status"), b.at("status"));
    assert_eq!(
        namespaced.version("v1alpha1").unwrap().printer_columns,
        global.version("v1alpha1").unwrap().printer_columns
    );
}

#[test]
fn prefix_pools_share_metal_and_status_with_the_address_pools() {
    // The same schema as MetalIPPool's; only the descriptions speak of
    // sub-prefixes rather than addresses.
    let ip = our_crd("metalippools");
    let ip = ip.schema_for("v1alpha1").unwrap();
    for (plural, _, _) in PREFIX_CRDS {
        let crd = our_crd(plural);
        let prefix = crd.schema_for("v1alpha1").unwrap();
        for field in ["spec.metal", "status"] {
            assert_eq!(
                without_descriptions(prefix.at(field).unwrap()),
                without_descriptions(ip.at(field).unwrap()),
                "{plural}: {field}"
            );
        }
        // Below spec.metal's own description, the text is MetalIPPool's too.
        for field in [
            "spec.metal.vrf",
            "spec.metal.reservation",
            "spec.metal.vlan",
        ] {
            assert_eq!(prefix.at(field), ip.at(field), "{plural}: {field}");
        }
    }
}

#[test]
fn prefix_spec_mirrors_in_cluster_prefix_pools_plus_ours() {
    let ours = our_crd("metalprefixpools");
    let ours = ours.schema_for("v1alpha1").unwrap();
    let in_cluster = capi_crd(IN_CLUSTER_PREFIX_POOLS);
    let theirs = in_cluster.schema_for("v1alpha2").unwrap();

    let field_names = |schema: &Value| -> Vec<String> {
        schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let mut expected = field_names(theirs.at("spec").unwrap());
    expected.extend([
        "preAllocations".into(),
        "addressReuseGracePeriodSeconds".into(),
        "metal".into(),
    ]);
    expected.sort();
    let mut actual = field_names(ours.at("spec").unwrap());
    actual.sort();
    assert_eq!(actual, expected);
    // prefixes is required as in-cluster's, unless the pool is VRF-backed
    // (its block is then the prefix).
    assert_eq!(theirs.at("spec").unwrap()["required"], json!(["prefixes"]));
    assert_eq!(ours.at("spec").unwrap().get("required"), None);
    assert_eq!(
        ours.at("spec").unwrap()["anyOf"],
        json!([{"required": ["prefixes"]}, {"required": ["metal"]}])
    );
    for field in [
        "spec.prefixes",
        "spec.allocationPrefixLength",
        "spec.excludedPrefixes",
        "spec.gateway",
        "status.ipAddresses.total",
        "status.ipAddresses.free",
        "status.ipAddresses.used",
        "status.ipAddresses.outOfRange",
    ] {
        assert_eq!(
            ours.at(field).unwrap()["type"],
            theirs.at(field).unwrap()["type"],
            "{field}"
        );
    }
    let length = ours.at("spec.allocationPrefixLength").unwrap();
    let reference = theirs.at("spec.allocationPrefixLength").unwrap();
    for key in ["default", "minimum", "maximum"] {
        assert_eq!(length[key], reference[key], "allocationPrefixLength {key}");
    }
    assert_eq!(
        (&length["default"], &length["minimum"], &length["maximum"]),
        (&json!(64), &json!(1), &json!(128))
    );
    for field in ["spec.prefixes", "spec.excludedPrefixes"] {
        assert_eq!(ours.at(field).unwrap()["maxItems"], 1024, "{field}");
    }
    let grace = ours.at("spec.addressReuseGracePeriodSeconds").unwrap();
    assert_eq!(
        (&grace["format"], &grace["minimum"], &grace["maximum"]),
        (&json!("int32"), &json!(0), &json!(2_147_483_647))
    );
    assert_eq!(
        ours.at("spec.preAllocations").unwrap()["additionalProperties"]["type"],
        "string"
    );
}

#[test]
fn the_ipv4_length_rule_is_a_cel_rule_on_spec() {
    // The validator here does not run CEL; the rule's text is pinned so that
    // a change to it is deliberate. A prefix without ':' is IPv4 (every IPv6
    // text form has one, IPv4-mapped included). The webhook checks the same.
    for (plural, _, _) in PREFIX_CRDS {
        let crd = our_crd(plural);
        let spec = crd.schema_for("v1alpha1").unwrap().at("spec").unwrap();
        assert_eq!(
            spec["x-kubernetes-validations"],
            json!([{
                "fieldPath": ".allocationPrefixLength",
                "message": "allocationPrefixLength must be at most 32 for IPv4 prefixes",
                "rule": "!has(self.prefixes) || !has(self.allocationPrefixLength) || \
                         self.allocationPrefixLength <= 32 || \
                         self.prefixes.all(p, p.contains(':'))"
            }]),
            "{plural}"
        );
    }
    // What the rule lets through: every example (the IPv4 ones ask for /28
    // and /29; the VRF one has no prefixes, so the webhook alone judges it).
    for file in [
        "metalprefixpool.yaml",
        "globalmetalprefixpool.yaml",
        "vrf-metalprefixpool.yaml",
    ] {
        let spec = &example(file)["spec"];
        let length = spec["allocationPrefixLength"].as_u64().unwrap_or(64);
        let all_v6 = spec["prefixes"]
            .as_array()
            .map(|p| p.iter().all(|p| p.as_str().unwrap().contains(':')));
        assert!(all_v6.is_none_or(|v6| v6 || length <= 32), "{file}");
    }
}

#[test]
fn prefix_printer_columns_match_in_cluster_plus_length_and_age() {
    for (plural, _, _) in PREFIX_CRDS {
        let crd = our_crd(plural);
        let columns: Vec<(&str, &str, &str)> = crd
            .version("v1alpha1")
            .unwrap()
            .printer_columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Prefixes", "string", ".spec.prefixes"),
                ("Length", "integer", ".spec.allocationPrefixLength"),
                ("Total", "integer", ".status.ipAddresses.total"),
                ("Free", "integer", ".status.ipAddresses.free"),
                ("Used", "integer", ".status.ipAddresses.used"),
                ("Age", "date", ".metadata.creationTimestamp"),
            ],
            "{plural}"
        );
    }
}

#[test]
fn prefix_entries_must_look_like_a_cidr() {
    let crd = our_crd("metalprefixpools");
    let pool = example("metalprefixpool.yaml");
    for good in [
        "2001:db8::/48",
        "10.20.0.0/22",
        "::/0",
        "::ffff:192.0.2.0/120",
        "2001:0db8:0000:0000:0000:ffff:255.255.255.255/128",
    ] {
        let mut p = pool.clone();
        p["spec"]["prefixes"] = json!([good]);
        assert_valid(&crd, &p);
    }
    // Alignment and one family are the webhook's: the schema sees a CIDR.
    for bad in [
        "",
        "2001:db8::",
        "2001:db8::1-2001:db8::ff",
        "2001:db8::/48/64",
        "2001:db8::/1000",
        "2001:db8:: /48",
        "fd00::/48,fd01::/48",
    ] {
        assert_rejected(
            &crd,
            &pool,
            set("/spec/prefixes/0", json!(bad)),
            &["spec.prefixes[0]"],
        );
    }
    // excludedPrefixes takes addresses, ranges and CIDRs, like excludedAddresses.
    for good in [
        "2001:db8:100::1",
        "2001:db8:100::1-2001:db8:100::ff",
        "2001:db8:100:7::/64",
    ] {
        let mut p = pool.clone();
        p["spec"]["excludedPrefixes"] = json!([good]);
        assert_valid(&crd, &p);
    }
    for bad in ["", "host.example", "2001:db8::/64/64"] {
        assert_rejected(
            &crd,
            &pool,
            set("/spec/excludedPrefixes/0", json!(bad)),
            &["spec.excludedPrefixes[0]"],
        );
    }
    // preAllocations: a CIDR or the bare network address, not a range.
    for good in ["2001:db8:100:5::/64", "2001:db8:100:5::"] {
        let mut p = pool.clone();
        p["spec"]["preAllocations"]["web-cp-0-v6"] = json!(good);
        assert_valid(&crd, &p);
    }
    for bad in [
        "2001:db8:100:5::-2001:db8:100:6::",
        "",
        "2001:db8:100:5::/64 ",
    ] {
        assert_rejected(
            &crd,
            &pool,
            set("/spec/preAllocations/web-cp-0-v6", json!(bad)),
            &["spec.preAllocations[web-cp-0-v6]"],
        );
    }
    assert_rejected(
        &crd,
        &pool,
        set("/spec/gateway", json!("fe80::1/64")),
        &["spec.gateway"],
    );
}

#[test]
fn broken_prefix_pools_are_rejected_with_the_right_paths() {
    for (plural, file) in [
        ("metalprefixpools", "metalprefixpool.yaml"),
        ("globalmetalprefixpools", "globalmetalprefixpool.yaml"),
    ] {
        let crd = our_crd(plural);
        let pool = example(file);
        assert_valid(&crd, &pool);
        let check = |edit: Box<dyn FnOnce(&mut Value)>, paths: &[&str]| {
            assert_rejected(&crd, &pool, edit, paths)
        };
        // Required unless metal is set: an anyOf, reported on spec.
        check(Box::new(remove("/spec/prefixes")), &["spec"]);
        check(
            Box::new(set("/spec/prefixes", json!([]))),
            &["spec.prefixes"],
        );
        let too_many: Vec<String> = (0..1025)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect();
        check(
            Box::new(set("/spec/prefixes", json!(too_many))),
            &["spec.prefixes"],
        );
        let too_many: Vec<String> = (0..1025).map(|i| format!("10.20.0.{}", i % 256)).collect();
        check(
            Box::new(set("/spec/excludedPrefixes", json!(too_many))),
            &["spec.excludedPrefixes"],
        );
        // allocationPrefixLength: 1 to 128 (it has a default, so it may be left out).
        let mut defaulted = pool.clone();
        defaulted["spec"]
            .as_object_mut()
            .unwrap()
            .remove("allocationPrefixLength");
        assert_valid(&crd, &defaulted);
        for bad in [
            json!(0),
            json!(129),
            json!(-1),
            json!("64"),
            json!(64.5),
            json!(null),
        ] {
            check(
                Box::new(set("/spec/allocationPrefixLength", bad)),
                &["spec.allocationPrefixLength"],
            );
        }
        for good in [1, 128] {
            let mut p = pool.clone();
            p["spec"]["allocationPrefixLength"] = json!(good);
            assert_valid(&crd, &p);
        }
        check(
            Box::new(set("/spec/addressReuseGracePeriodSeconds", json!(-1))),
            &["spec.addressReuseGracePeriodSeconds"],
        );
        check(
            Box::new(set(
                "/spec/addressReuseGracePeriodSeconds",
                json!(2_147_483_648_i64),
            )),
            &["spec.addressReuseGracePeriodSeconds"],
        );
        // Wrong types.
        check(
            Box::new(set("/spec/prefixes", json!("10.20.0.0/22"))),
            &["spec.prefixes"],
        );
        check(
            Box::new(set("/spec/prefixes/0", json!(22))),
            &["spec.prefixes[0]"],
        );
        check(
            Box::new(set("/spec/excludedPrefixes", json!("10.20.0.0/28"))),
            &["spec.excludedPrefixes"],
        );
        check(
            Box::new(set("/spec/preAllocations", json!({"web-cp-1": 20}))),
            &["spec.preAllocations[web-cp-1]"],
        );
        check(
            Box::new(set("/spec/preAllocations", json!(["10.20.0.16/28"]))),
            &["spec.preAllocations"],
        );
        check(Box::new(set("/spec/gateway", json!(1))), &["spec.gateway"]);
        check(Box::new(set("/spec/metal", json!("da"))), &["spec.metal"]);
        // Unknown fields: the address pools' and in-cluster's v1alpha1 names
        // are not prefix pool fields.
        for field in [
            "addresses",
            "prefix",
            "excludedAddresses",
            "allocateReservedIPAddresses",
            "subnet",
        ] {
            let mut broken = pool.clone();
            broken["spec"][field] = json!(["10.20.0.0/22"]);
            let result = crd.validate(&broken);
            assert_eq!(error_paths(result), [format!("spec.{field}")], "{plural}");
        }
        check(Box::new(set("/unknown", json!(1))), &["unknown"]);
        check(
            Box::new(set("/apiVersion", json!("ipam.cluster.x-k8s.io/v1alpha2"))),
            &["apiVersion"],
        );
    }
}

#[test]
fn a_vrf_backed_prefix_pool_needs_no_prefixes() {
    let crd = our_crd("metalprefixpools");
    let vrf = example("vrf-metalprefixpool.yaml");
    assert!(vrf["spec"].get("prefixes").is_none());
    assert_valid(&crd, &vrf);
    // prefixes may be given too (within the block; the webhook checks that).
    let mut both = vrf.clone();
    both["spec"]["prefixes"] = json!(["10.30.1.0/26"]);
    assert_valid(&crd, &both);
    // Neither: refused on spec, as for the address pools.
    assert_rejected(&crd, &vrf, remove("/spec/metal"), &["spec"]);
    // metal is checked as MetalIPPool's is.
    assert_rejected(
        &crd,
        &vrf,
        remove("/spec/metal/metro"),
        &["spec.metal.metro"],
    );
    assert_rejected(
        &crd,
        &vrf,
        set("/spec/metal/vlan/vxlan", json!(4000)),
        &["spec.metal.vlan.vxlan"],
    );
    assert_rejected(
        &crd,
        &vrf,
        set("/spec/metal/reservation/size", json!(26)),
        &["spec.metal.reservation.size"],
    );
}

#[test]
fn prefix_pool_status_is_checked_too() {
    let crd = our_crd("metalprefixpools");
    let mut pool = example("metalprefixpool.yaml");
    pool["status"] = json!({
        "ipAddresses": {"total": 65280, "free": 65279, "used": 1, "outOfRange": 0},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "PoolReady", "message": "",
            "lastTransitionTime": "2026-11-29T18:17:07Z", "observedGeneration": 1
        }],
        "metal": {"reservation": {"id": "r", "block": "10.30.1.0/26", "created": true}}
    });
    assert_valid(&crd, &pool);
    assert_rejected(
        &crd,
        &pool,
        remove("/status/ipAddresses/outOfRange"),
        &["status.ipAddresses.outOfRange"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/ipAddresses/total", json!(u64::MAX)),
        &["status.ipAddresses.total"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/conditions/0/status", json!("yes")),
        &["status.conditions[0].status"],
    );
    assert_rejected(
        &crd,
        &pool,
        set("/status/prefixes", json!(1)),
        &["status.prefixes"],
    );
}

#[test]
fn prefix_examples_fit_together() {
    let pool = example("metalprefixpool.yaml");
    let global = example("globalmetalprefixpool.yaml");
    let vrf = example("vrf-metalprefixpool.yaml");
    let claim = example("ipaddressclaim-prefix.yaml");

    // The namespaced example: IPv6, a /48 handing out /64s, one exclusion
    // and one preAllocation.
    assert!(pool["metadata"]["namespace"].is_string());
    assert_eq!(pool["spec"]["prefixes"], json!(["2001:db8:100::/48"]));
    assert_eq!(pool["spec"]["allocationPrefixLength"], 64);
    assert_eq!(
        pool["spec"]["excludedPrefixes"].as_array().unwrap().len(),
        1
    );
    assert_eq!(pool["spec"]["preAllocations"].as_object().unwrap().len(), 1);
    // The global example: cluster-scoped IPv4, /28s of a /22.
    assert!(global["metadata"].get("namespace").is_none());
    assert_eq!(global["spec"]["prefixes"], json!(["10.20.0.0/22"]));
    assert_eq!(global["spec"]["allocationPrefixLength"], 28);
    // The VRF example: IPv4 /29s of a /26 reservation.
    assert_eq!(vrf["kind"], "MetalPrefixPool");
    assert_eq!(vrf["spec"]["allocationPrefixLength"], 29);
    assert_eq!(vrf["spec"]["metal"]["reservation"]["cidr"], 26);
    assert!(vrf["spec"]["metal"]["vrf"].is_object());
    // Its own VRF, VLAN and block: not those of vrf-metalippool.yaml.
    let vrf_ip = example("vrf-metalippool.yaml");
    for field in ["vrf", "vlan", "reservation"] {
        assert_ne!(
            vrf["spec"]["metal"][field], vrf_ip["spec"]["metal"][field],
            "{field}"
        );
    }

    // The claim points at the namespaced pool, from the pool's namespace …
    assert_eq!(claim["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(
        claim["spec"]["poolRef"],
        json!({"apiGroup": OUR_GROUP, "kind": "MetalPrefixPool", "name": pool["metadata"]["name"]})
    );
    assert_eq!(
        claim["metadata"]["namespace"],
        pool["metadata"]["namespace"]
    );
    // … and is the one the pool pre-allocates a /64 for.
    let name = claim["metadata"]["name"].as_str().unwrap();
    let pre = pool["spec"]["preAllocations"][name].as_str();
    assert_eq!(
        pre,
        Some("2001:db8:100:5::/64"),
        "preAllocations should pin {name}"
    );
    // Not the address pool example's claim: both can be applied together.
    assert_ne!(example("ipaddressclaim.yaml")["metadata"]["name"], name);
}
