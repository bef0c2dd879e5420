//! The SpinKube manifests in deploy/: every YAML document parses and is a
//! named object; kustomization.yaml lists exactly the manifests to apply, in
//! install order; and the manifests agree with each other, with spin.toml
//! and with the code (Spin variables, routes, key-value stores, the
//! Kubernetes permissions, the Service URL, the Secrets they reference).
//!
//! crds.rs checks the CRDs themselves and the named examples in depth; this
//! file checks that whatever sits in deploy/examples/ validates against some
//! CRD, and how the rest of deploy/ uses the CRDs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use metal_ipam_tests::schema::{capi_crds_dir, load_crd, load_yaml_documents, repo_root, Crd};
use serde_json::{json, Value};

const NAMESPACE: &str = "metal-ipam-system";
const APP: &str = "metal-ipam";
const OUR_GROUP: &str = "ipam.metal-ipam.dev";

/// Every (API group, resource, verb) the code uses against the Kubernetes
/// API; the ClusterRole `metal-ipam` in deploy/rbac.yaml must grant exactly
/// this (tests/tests/capi.rs checks the code's real requests against it).
use metal_ipam_core::kube::USED_PERMISSIONS;

/// The components that call the Kubernetes API, and so need the cluster CA
/// in the runtime config's `[[client_tls]]`.
const KUBE_CLIENT_COMPONENTS: &[&str] = &[
    "pools",
    "allocate",
    "release",
    "reconcile",
    "provision",
    "assign",
    "poll",
    "network",
    "admission",
];

/// What each route the manifests call must reach, by component.
const CALLED_ROUTES: &[(&str, &str)] = &[
    ("/healthz", "healthz"),
    ("/v1/events", "events"),
    ("/v1/admission/pools", "admission"),
    ("/v1/admission/network-profiles", "admission"),
    ("/v1/reconcile", "reconcile"),
    ("/v1/metal/poll", "poll"),
];

/// The keys Spin 3.6 accepts in a `[[client_tls]]` entry (it denies unknown
/// fields, so a typo stops the app from starting).
const CLIENT_TLS_KEYS: &[&str] = &[
    "component_ids",
    "hosts",
    "ca_use_webpki_roots",
    "ca_roots_file",
    "client_cert_file",
    "client_private_key_file",
];

/// Configuration documents that are not API objects and have no metadata.
const CONFIG_KINDS: &[(&str, &str)] = &[
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
    ("apiserver.config.k8s.io/v1", "AdmissionConfiguration"),
    ("v1", "Config"),
];

/// Kinds applied by the kustomization that are cluster-scoped; every other
/// kind it applies must be known here as namespaced.
const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "CustomResourceDefinition",
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
];
const NAMESPACED_KINDS: &[&str] = &[
    "Service",
    "StatefulSet",
    "NetworkPolicy",
    "ServiceAccount",
    "Secret",
    "SpinApp",
    "PodDisruptionBudget",
    "ApiServerSource",
    "Ingress",
    "CronJob",
];

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

/// One YAML document of a file under deploy/.
#[derive(Debug, Clone)]
struct Doc {
    /// Path relative to deploy/, with `/` separators.
    file: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }
    fn group(&self) -> &str {
        let api_version = self.value["apiVersion"].as_str().unwrap_or_default();
        api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }
}

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

/// Every `.yaml`/`.yml` file under deploy/, relative, sorted; but
/// `monitoring/`, which holds Prometheus configuration rather than
/// Kubernetes objects (`tests/prometheus.rs` checks it with promtool and a
/// real Prometheus), and `clusterctl/`, the artifacts generated from the
/// rest with clusterctl variables in them (`tests/clusterctl.rs` checks
/// them).
fn yaml_files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir()
                && path
                    .file_name()
                    .is_some_and(|n| n == "monitoring" || n == "clusterctl")
            {
                continue;
            }
            if path.is_dir() {
                walk(&path, base, out);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                let rel = path.strip_prefix(base).unwrap();
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut files = Vec::new();
    walk(&deploy_dir(), &deploy_dir(), &mut files);
    files.sort();
    files
}

fn docs_of(file: &str) -> Vec<Doc> {
    let path = deploy_dir().join(file);
    load_yaml_documents(&path)
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
        .into_iter()
        .map(|value| Doc {
            file: file.to_string(),
            value,
        })
        .collect()
}

fn all_docs() -> Vec<Doc> {
    yaml_files().iter().flat_map(|f| docs_of(f)).collect()
}

/// The files kustomization.yaml applies, in order.
fn kustomization_resources() -> Vec<String> {
    let k = kustomization();
    k["resources"]
        .as_array()
        .expect("kustomization.yaml has a resources list")
        .iter()
        .map(|r| r.as_str().expect("resources are paths").to_string())
        .collect()
}

fn kustomization() -> Value {
    let docs = docs_of("kustomization.yaml");
    assert_eq!(docs.len(), 1, "kustomization.yaml holds one document");
    docs[0].value.clone()
}

/// The documents kubectl apply -k would apply.
fn applied_docs() -> Vec<Doc> {
    kustomization_resources()
        .iter()
        .flat_map(|f| docs_of(f))
        .collect()
}

/// The only document of `kind` named `name` in `docs`.
fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    let found: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == kind && d.name() == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} {name}, found {}",
        found.len()
    );
    found[0]
}

/// The only document of `kind` in `docs`.
fn only<'a>(docs: &'a [Doc], kind: &str) -> &'a Doc {
    let found: Vec<&Doc> = docs.iter().filter(|d| d.kind() == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}

fn spin_app(docs: &[Doc]) -> &Value {
    &find(docs, "SpinApp", APP).value
}

/// The in-cluster base URL of the SpinApp: the spin-operator creates a
/// ClusterIP Service with the SpinApp's name, port 80.
fn service_url(docs: &[Doc]) -> String {
    let app = find(docs, "SpinApp", APP);
    let ns = app.namespace().expect("the SpinApp names its namespace");
    format!("http://{}.{ns}.svc.cluster.local", app.name())
}

fn spin_toml() -> toml::Table {
    let path = repo_root().join("spin.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The SpinApp's variables, by name.
fn spin_app_variables(docs: &[Doc]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for v in spin_app(docs)["spec"]["variables"]
        .as_array()
        .expect("the SpinApp has variables")
    {
        let name = v["name"]
            .as_str()
            .expect("a variable has a name")
            .to_string();
        assert!(
            out.insert(name.clone(), v.clone()).is_none(),
            "SpinApp variable {name} is set twice"
        );
    }
    out
}

/// Secrets defined anywhere under deploy/: (namespace, name) -> the keys
/// they hold. A service-account-token Secret holds what the token
/// controller fills in.
fn defined_secrets(docs: &[Doc]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for d in docs.iter().filter(|d| d.kind() == "Secret") {
        let ns = d.namespace().expect("every Secret names its namespace");
        let mut keys: BTreeSet<String> = BTreeSet::new();
        for field in ["data", "stringData"] {
            if let Some(map) = d.value[field].as_object() {
                keys.extend(map.keys().cloned());
            }
        }
        if d.value["type"] == "kubernetes.io/service-account-token" {
            keys.extend(["token", "ca.crt", "namespace"].map(String::from));
        }
        out.insert((ns.to_string(), d.name().to_string()), keys);
    }
    out
}

/// The runtime-config.toml that the SpinApp loads, as embedded in the
/// example Secret.
fn runtime_config(docs: &[Doc]) -> Value {
    let secret_name = spin_app(docs)["spec"]["runtimeConfig"]["loadFromSecret"]
        .as_str()
        .expect("the SpinApp loads its runtime config from a Secret");
    let secret = find(docs, "Secret", secret_name);
    assert_eq!(secret.file, "secrets.example.yaml");
    let text = secret.value["stringData"]["runtime-config.toml"]
        .as_str()
        .expect("the Secret's key is runtime-config.toml (the operator mounts only that key)");
    let table: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("runtime-config.toml: {e}"));
    serde_json::to_value(table).unwrap()
}

/// Every object under `value` that has a member `key`, with its path.
fn collect_members<'a>(
    value: &'a Value,
    key: &str,
    path: String,
    out: &mut Vec<(String, &'a Value)>,
) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = format!("{path}.{k}");
                if k == key {
                    out.push((p.clone(), v));
                }
                collect_members(v, key, p, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect_members(v, key, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected a list of strings, got {value}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("not a string: {v}"))
                .to_string()
        })
        .collect()
}

fn string_set(value: &Value) -> BTreeSet<String> {
    strings(value).into_iter().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// (group, resource, verb) triples a ClusterRole grants. Wildcards and
/// resourceNames are refused outright.
fn granted(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("a ClusterRole has rules") {
        assert!(
            rule.get("resourceNames").is_none(),
            "no resourceNames: {rule}"
        );
        assert!(
            rule.get("nonResourceURLs").is_none(),
            "no nonResourceURLs: {rule}"
        );
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for part in [&group, &resource, &verb] {
                        assert!(!part.contains('*'), "no wildcards in RBAC: {rule}");
                    }
                    let new = out.insert((group.clone(), resource.clone(), verb.clone()));
                    assert!(new, "{group} {resource} {verb} is granted twice");
                }
            }
        }
    }
    out
}

/// The subjects of the ClusterRoleBindings to `role`: (namespace, name) of
/// ServiceAccounts.
fn bound_service_accounts(docs: &[Doc], role: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for b in docs.iter().filter(|d| d.kind() == "ClusterRoleBinding") {
        if b.value["roleRef"]
            != json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role})
        {
            continue;
        }
        for s in b.value["subjects"].as_array().unwrap() {
            assert_eq!(s["kind"], "ServiceAccount", "{}: {s}", b.name());
            out.insert((
                s["namespace"].as_str().unwrap().to_string(),
                s["name"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// Our pool CRDs as the kustomization applies them.
fn our_crds() -> Vec<Crd> {
    kustomization_resources()
        .iter()
        .filter(|f| f.starts_with("crds/"))
        .map(|f| load_crd(deploy_dir().join(f)).unwrap_or_else(|e| panic!("{f}: {e:#}")))
        .collect()
}

/// The Cluster API IPAM CRDs (IPAddressClaim, IPAddress) from the shared
/// reference data.
fn capi_crds() -> Vec<Crd> {
    [
        "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
        "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddresses.yaml",
    ]
    .iter()
    .map(|f| {
        let path = capi_crds_dir().join(f);
        load_crd(&path).unwrap_or_else(|e| panic!("{f}: {e:#}"))
    })
    .collect()
}

/// The plural of `group`/`kind`, which must be served at `version`. The
/// CAPI core `Machine` and CAPP's `PacketMachine` CRDs are not vendored:
/// their plural and version are the ones `metal_ipam_core::kube::MACHINES`
/// and `PACKET_MACHINES` (the code's own requests) use.
fn plural_of(crds: &[Crd], api_version: &str, kind: &str) -> String {
    for r in [
        &metal_ipam_core::kube::MACHINES,
        &metal_ipam_core::kube::PACKET_MACHINES,
    ] {
        if kind == r.kind && api_version == r.api_version() {
            return r.plural.to_string();
        }
    }
    let (group, version) = api_version.split_once('/').expect("group/version");
    let crd = crds
        .iter()
        .find(|c| c.group() == group && c.kind() == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind} in {group}"));
    assert!(
        crd.served_versions().contains(&version),
        "{} does not serve {version}",
        crd.name()
    );
    crd.plural().to_string()
}

/// Does a Spin route (`/exact` or `/prefix/...`) match `path`?
fn route_matches(route: &str, path: &str) -> bool {
    match route.strip_suffix("/...") {
        Some(prefix) => path == prefix || path.starts_with(&format!("{prefix}/")),
        None => route == path,
    }
}

/// The component spin.toml routes `path` to (the longest matching route).
fn component_for(manifest: &toml::Table, path: &str) -> Option<String> {
    let triggers = manifest["trigger"]["http"]
        .as_array()
        .expect("[[trigger.http]]");
    triggers
        .iter()
        .filter_map(|t| Some((t.get("route")?.as_str()?, t.get("component")?.as_str()?)))
        .filter(|(route, _)| route_matches(route, path))
        .max_by_key(|(route, _)| route.trim_end_matches("/...").len())
        .map(|(_, component)| component.to_string())
}

// ---------------------------------------------------------------------------
// Files and the kustomization
// ---------------------------------------------------------------------------

#[test]
fn every_document_is_a_named_object() {
    let docs = all_docs();
    assert!(
        docs.len() >= 20,
        "only {} documents under deploy/",
        docs.len()
    );
    for d in &docs {
        let api_version = d.value["apiVersion"].as_str().unwrap_or_default();
        assert!(
            !api_version.is_empty(),
            "{}: a document without apiVersion",
            d.file
        );
        assert!(!d.kind().is_empty(), "{}: a document without kind", d.file);
        if CONFIG_KINDS.contains(&(api_version, d.kind())) {
            continue;
        }
        assert!(
            !d.name().is_empty(),
            "{}: {} without metadata.name",
            d.file,
            d.kind()
        );
    }
}

#[test]
fn kustomization_lists_every_manifest_in_install_order() {
    let listed = kustomization_resources();
    for f in &listed {
        assert!(
            deploy_dir().join(f).is_file(),
            "kustomization.yaml lists {f}, which does not exist"
        );
    }
    let unique: BTreeSet<&String> = listed.iter().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "a file is listed twice: {listed:?}"
    );

    // Everything but the examples, the *.example.yaml files and the
    // kustomization itself is applied.
    let expected: BTreeSet<String> = yaml_files()
        .into_iter()
        .filter(|f| f != "kustomization.yaml")
        .filter(|f| !f.ends_with(".example.yaml"))
        .filter(|f| !f.starts_with("examples/"))
        .collect();
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        listed_set, expected,
        "kustomization.yaml resources vs files in deploy/"
    );

    // kubectl applies them in the listed order (the README's install order).
    assert_eq!(kustomization()["sortOptions"], json!({"order": "fifo"}));
    let position = |file: &str| {
        listed
            .iter()
            .position(|f| f == file)
            .unwrap_or_else(|| panic!("{file} is not listed"))
    };
    let order = [
        "namespace.yaml",
        "valkey.yaml",
        "rbac.yaml",
        "spinapp.yaml",
        "apiserversource.yaml",
        "webhook.yaml",
        "reconcile-cronjob.yaml",
        "metal-poll-cronjob.yaml",
    ];
    for pair in order.windows(2) {
        assert!(
            position(pair[0]) < position(pair[1]),
            "{} must come before {}",
            pair[0],
            pair[1]
        );
    }
    let first_non_crd = listed.iter().position(|f| !f.starts_with("crds/")).unwrap();
    assert!(
        listed[..first_non_crd]
            .iter()
            .all(|f| f.starts_with("crds/"))
            && first_non_crd > 0,
        "the CRDs come first: {listed:?}"
    );
}

#[test]
fn applied_objects_are_unique_and_in_the_right_namespace() {
    let docs = applied_docs();
    let mut seen = BTreeSet::new();
    for d in &docs {
        let key = (
            d.group().to_string(),
            d.kind().to_string(),
            d.namespace().map(str::to_string),
            d.name().to_string(),
        );
        assert!(
            seen.insert(key),
            "{}: {} {} is defined twice",
            d.file,
            d.kind(),
            d.name()
        );
        // No kustomize namespace transformer: a missing namespace would land
        // in whatever namespace kubectl's context points at.
        if CLUSTER_SCOPED_KINDS.contains(&d.kind()) {
            assert_eq!(
                d.namespace(),
                None,
                "{}: {} {} is cluster-scoped",
                d.file,
                d.kind(),
                d.name()
            );
        } else {
            assert!(
                NAMESPACED_KINDS.contains(&d.kind()),
                "{}: add {} to CLUSTER_SCOPED_KINDS or NAMESPACED_KINDS",
                d.file,
                d.kind()
            );
            assert_eq!(
                d.namespace(),
                Some(NAMESPACE),
                "{}: {} {}",
                d.file,
                d.kind(),
                d.name()
            );
        }
    }
    let ns = only(&docs, "Namespace");
    assert_eq!(ns.name(), NAMESPACE);
}

// ---------------------------------------------------------------------------
// CRDs and examples
// ---------------------------------------------------------------------------

#[test]
fn every_example_validates_against_its_crd() {
    let mut crds = our_crds();
    crds.extend(capi_crds());
    let examples: Vec<Doc> = yaml_files()
        .iter()
        .filter(|f| f.starts_with("examples/"))
        .flat_map(|f| docs_of(f))
        .collect();
    assert!(
        examples.len() >= 3,
        "deploy/examples/ holds {} objects",
        examples.len()
    );
    for ex in &examples {
        let api_version = ex.value["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap();
        let crd = crds
            .iter()
            .find(|c| c.group() == group && c.kind() == ex.kind())
            .unwrap_or_else(|| panic!("{}: no CRD for {api_version} {}", ex.file, ex.kind()));
        assert!(
            crd.served_versions().contains(&version),
            "{}: {version} not served",
            ex.file
        );
        if let Err(errors) = crd.validate(&ex.value) {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            panic!("{} does not validate:\n  {}", ex.file, lines.join("\n  "));
        }
    }
}

#[test]
fn the_kustomization_applies_every_pool_crd() {
    let crds = our_crds();
    let kinds: BTreeSet<&str> = crds.iter().map(Crd::kind).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "MetalIPPool",
            "GlobalMetalIPPool",
            "MetalPrefixPool",
            "GlobalMetalPrefixPool",
            "MetalNetworkProfile"
        ])
    );
    // Every CRD file in deploy/crds/ is applied (the real-API-server tests
    // install the directory's files, so the two must agree).
    let mut files: Vec<String> = std::fs::read_dir(deploy_dir().join("crds"))
        .unwrap()
        .map(|e| format!("crds/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    files.sort();
    let mut listed: Vec<String> = kustomization_resources()
        .into_iter()
        .filter(|f| f.starts_with("crds/"))
        .collect();
    listed.sort();
    assert_eq!(files, listed);
    for crd in &crds {
        assert_eq!(crd.group(), OUR_GROUP);
    }
}

// ---------------------------------------------------------------------------
// The SpinApp, its variables, runtime config and Secrets
// ---------------------------------------------------------------------------

#[test]
fn spin_app_runs_replicas_on_a_shared_redis_store() {
    let docs = all_docs();
    let spec = &spin_app(&docs)["spec"];
    assert_eq!(spec["executor"], "containerd-shim-spin");
    assert!(
        spec["replicas"].as_u64().unwrap_or(0) >= 2,
        "replicas: {}",
        spec["replicas"]
    );
    assert!(spec.get("enableAutoscaling").is_none());
    assert!(!spec["image"].as_str().unwrap_or_default().is_empty());
    // With loadFromSecret the operator ignores every other runtimeConfig
    // field; anything else there would be silently dropped.
    let runtime = spec["runtimeConfig"].as_object().unwrap();
    assert_eq!(runtime.keys().collect::<Vec<_>>(), ["loadFromSecret"]);

    // Every store label a component uses is a Redis store, each on its own
    // database (Spin's Redis backend ignores labels).
    let config = runtime_config(&docs);
    let stores = config["key_value_store"]
        .as_object()
        .expect("[key_value_store.*] tables");
    assert_eq!(
        stores["default"]["type"], "redis",
        "the default store must be shared, not per-pod SQLite"
    );
    let mut labels = BTreeSet::from(["default".to_string()]);
    for (_, component) in spin_toml()["component"].as_table().unwrap() {
        if let Some(kv) = component.get("key_value_stores") {
            labels.extend(
                kv.as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap().to_string()),
            );
        }
    }
    let mut urls = BTreeSet::new();
    for label in &labels {
        let store = &stores
            .get(label)
            .unwrap_or_else(|| panic!("runtime config has no [key_value_store.{label}]"));
        assert_eq!(store["type"], "redis", "store {label}");
        let url = store["url"].as_str().unwrap();
        assert!(
            url.starts_with("redis://") || url.starts_with("rediss://"),
            "{url}"
        );
        let db = url.rsplit_once('/').map(|(_, db)| db).unwrap_or_default();
        assert!(
            db.parse::<u32>().is_ok(),
            "store {label}: name the database number in {url}"
        );
        assert!(urls.insert(url.to_string()), "two store labels share {url}");
    }

    // The default store's host is the Valkey Service of valkey.yaml.
    let valkey = find(&docs, "Service", "valkey");
    let port = valkey.value["spec"]["ports"][0]["port"].as_u64().unwrap();
    let expected = format!(
        "redis://valkey.{}.svc.cluster.local:{port}/0",
        valkey.namespace().unwrap()
    );
    assert_eq!(stores["default"]["url"], expected.as_str());
}

#[test]
fn valkey_keeps_its_data_and_admits_only_the_app() {
    let docs = docs_of("valkey.yaml");
    let sts = &find(&docs, "StatefulSet", "valkey").value["spec"];
    assert_eq!(sts["replicas"], 1);
    let args = strings(&sts["template"]["spec"]["containers"][0]["args"]);
    let arg = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag}"));
        args[i + 1].clone()
    };
    assert_eq!(arg("--appendonly"), "yes");
    assert_eq!(arg("--maxmemory-policy"), "noeviction");
    assert_eq!(arg("--dir"), "/data");
    let mounts = &sts["template"]["spec"]["containers"][0]["volumeMounts"];
    assert_eq!(mounts[0]["mountPath"], "/data");
    assert_eq!(
        sts["volumeClaimTemplates"][0]["metadata"]["name"],
        mounts[0]["name"]
    );

    // The NetworkPolicy admits the pods the spin-operator labels with the
    // SpinApp's name.
    let policy = &find(&docs, "NetworkPolicy", "valkey").value["spec"];
    assert_eq!(
        policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
        json!({"core.spinoperator.dev/app-name": APP})
    );
    assert_eq!(
        policy["podSelector"]["matchLabels"],
        sts["selector"]["matchLabels"]
    );
}

#[test]
fn spin_app_sets_every_variable_spin_toml_declares() {
    let docs = all_docs();
    let set_vars = spin_app_variables(&docs);
    let manifest = spin_toml();
    let declared = manifest["variables"].as_table().expect("[variables]");
    for (name, decl) in declared {
        let required = decl.get("required").and_then(toml::Value::as_bool) == Some(true);
        let secret = decl.get("secret").and_then(toml::Value::as_bool) == Some(true);
        if required {
            assert!(
                set_vars.contains_key(name),
                "spin.toml requires {name}; the SpinApp does not set it"
            );
        }
        if secret {
            if let Some(v) = set_vars.get(name) {
                assert!(
                    v.get("value").is_none() && v["valueFrom"]["secretKeyRef"].is_object(),
                    "secret variable {name} must come from a Secret, not a literal: {v}"
                );
            }
        }
    }
    // A name spin.toml does not declare would be set and silently ignored.
    for name in set_vars.keys() {
        assert!(
            declared.contains_key(name),
            "the SpinApp sets {name}, which spin.toml does not declare"
        );
    }
    // Every variable the design has is set.
    let names: BTreeSet<&str> = set_vars.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "api_token",
            "events_token",
            "k8s_api_url",
            "k8s_token",
            "kv_swap_check",
            "metal_api_url",
            "metal_project_id",
            "metal_token",
            "pnap_api_url",
            "pnap_auth_url",
            "pnap_client_id",
            "pnap_client_secret",
            "read_token"
        ])
    );
    // The Metal token is optional: a cluster without VRF-backed pools has
    // no such Secret.
    assert_eq!(
        set_vars["metal_token"]["valueFrom"]["secretKeyRef"],
        json!({"name": "metal-ipam-metal", "key": "token", "optional": true})
    );
    // So are phoenixNAP's client credentials.
    for (name, key) in [
        ("pnap_client_id", "client-id"),
        ("pnap_client_secret", "client-secret"),
    ] {
        assert_eq!(
            set_vars[name]["valueFrom"]["secretKeyRef"],
            json!({"name": "metal-ipam-pnap", "key": key, "optional": true})
        );
    }
    assert_eq!(
        set_vars["k8s_api_url"]["value"],
        "https://kubernetes.default.svc"
    );
    assert_eq!(set_vars["kv_swap_check"]["value"], "auto");
    assert_eq!(
        set_vars["k8s_token"]["valueFrom"]["secretKeyRef"],
        json!({"name": "metal-ipam-k8s-token", "key": "token"})
    );
    assert_ne!(
        set_vars["api_token"]["valueFrom"], set_vars["events_token"]["valueFrom"],
        "events_token must be a different secret from api_token"
    );
}

#[test]
fn every_secret_key_ref_names_a_defined_secret_and_key() {
    let docs = all_docs();
    let secrets = defined_secrets(&docs);
    // The Secrets operators create come from secrets.example.yaml; the
    // ServiceAccount token from rbac.yaml.
    for d in docs.iter().filter(|d| d.kind() == "Secret") {
        assert!(
            [
                "secrets.example.yaml",
                "rbac.yaml",
                "argo-sensor.example.yaml"
            ]
            .contains(&d.file.as_str()),
            "{}: Secret {} belongs in secrets.example.yaml",
            d.file,
            d.name()
        );
    }
    let mut refs = 0;
    for d in &docs {
        let mut found = Vec::new();
        collect_members(&d.value, "secretKeyRef", String::new(), &mut found);
        for (path, r) in found {
            refs += 1;
            let ns = d
                .namespace()
                .unwrap_or_else(|| panic!("{}: {path} in an object without namespace", d.file));
            let name = r["name"].as_str().unwrap();
            let key = r["key"].as_str().unwrap();
            let keys = secrets
                .get(&(ns.to_string(), name.to_string()))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: {path} names Secret {ns}/{name}, defined nowhere in deploy/",
                        d.file
                    )
                });
            assert!(
                keys.contains(key),
                "{}: {path}: Secret {ns}/{name} has no key {key} ({keys:?})",
                d.file
            );
        }
    }
    assert!(refs >= 8, "only {refs} secretKeyRefs found");

    // The token Secret belongs to the ServiceAccount the ClusterRole is bound to.
    let token = find(&docs, "Secret", "metal-ipam-k8s-token");
    assert_eq!(token.value["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        token.value["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        APP
    );
}

#[test]
fn client_tls_trusts_the_mounted_cluster_ca_for_the_api_host() {
    let docs = all_docs();
    let config = runtime_config(&docs);
    let entries = config["client_tls"].as_array().expect("[[client_tls]]");
    assert_eq!(entries.len(), 1);
    let tls = entries[0].as_object().unwrap();
    for key in tls.keys() {
        assert!(
            CLIENT_TLS_KEYS.contains(&key.as_str()),
            "[[client_tls]] has unknown key {key}"
        );
    }
    assert_eq!(
        string_set(&tls["component_ids"]),
        set(KUBE_CLIENT_COMPONENTS)
    );

    // Hosts are names without a port, and include the host of k8s_api_url.
    let hosts = strings(&tls["hosts"]);
    for h in &hosts {
        assert!(
            !h.contains(':') && !h.contains('/'),
            "host {h}: a name, without scheme or port"
        );
    }
    let vars = spin_app_variables(&docs);
    let url = vars["k8s_api_url"]["value"].as_str().unwrap();
    let host = url
        .strip_prefix("https://")
        .expect("the API server over https");
    let host = host.split(['/', ':']).next().unwrap();
    assert!(
        hosts.iter().any(|h| h == host),
        "{host} is not in [[client_tls]] hosts {hosts:?}"
    );

    // ca_roots_file is the ca.crt of the kube-root-ca.crt ConfigMap, mounted
    // by the SpinApp; and no public roots are mixed in.
    assert!(tls.get("ca_use_webpki_roots").is_none_or(|v| v == false));
    let ca_file = tls["ca_roots_file"].as_str().unwrap();
    let (dir, file) = ca_file.rsplit_once('/').unwrap();
    let spec = &spin_app(&docs)["spec"];
    let mount = spec["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(
        volume["configMap"]["items"],
        json!([{"key": "ca.crt", "path": file}])
    );

    // Components spin.toml lets reach the API server must be covered, and
    // the listed ones must exist.
    let manifest = spin_toml();
    let components = manifest["component"].as_table().unwrap();
    for id in KUBE_CLIENT_COMPONENTS {
        assert!(
            components.contains_key(*id),
            "[[client_tls]] names {id}, which spin.toml does not define"
        );
    }
    for (id, component) in components {
        let reaches_api = component
            .get("allowed_outbound_hosts")
            .and_then(toml::Value::as_array)
            .is_some_and(|hosts| {
                hosts
                    .iter()
                    .filter_map(toml::Value::as_str)
                    .any(|h| h.contains(host) || h.contains("k8s_api"))
            });
        if reaches_api {
            assert!(
                KUBE_CLIENT_COMPONENTS.contains(&id.as_str()),
                "spin.toml lets {id} reach the API server, but [[client_tls]] does not cover it"
            );
        }
    }
}

#[test]
fn probes_and_called_routes_exist_in_spin_toml() {
    let docs = all_docs();
    let manifest = spin_toml();
    for (path, component) in CALLED_ROUTES {
        assert_eq!(
            component_for(&manifest, path).as_deref(),
            Some(*component),
            "spin.toml must route {path} to {component}"
        );
    }
    let checks = &spin_app(&docs)["spec"]["checks"];
    for probe in ["readiness", "liveness"] {
        assert_eq!(checks[probe]["httpGet"]["path"], "/healthz", "{probe}");
    }
}

// ---------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------

#[test]
fn cluster_role_grants_exactly_what_the_code_uses() {
    let docs = docs_of("rbac.yaml");
    let role = find(&docs, "ClusterRole", APP);
    let expected: BTreeSet<(String, String, String)> = USED_PERMISSIONS
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        expected.len(),
        USED_PERMISSIONS.len(),
        "USED_PERMISSIONS has a duplicate"
    );
    let granted = granted(&role.value);
    let missing: Vec<_> = expected.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );

    // Bound to the ServiceAccount whose token the SpinApp uses.
    assert_eq!(
        bound_service_accounts(&docs, APP),
        BTreeSet::from([(NAMESPACE.to_string(), APP.to_string())])
    );
    let all = all_docs();
    assert_eq!(spin_app(&all)["spec"]["serviceAccountName"], APP);
    let sa = find(&docs, "ServiceAccount", APP);
    assert_eq!(sa.value["automountServiceAccountToken"], false);
}

/// The prefix pool kinds are granted what the address pool kinds are, in
/// both ClusterRoles: what the code's list (USED_PERMISSIONS) says about
/// them is checked above; this holds whatever that list says.
#[test]
fn prefix_pools_are_granted_what_address_pools_are() {
    let docs = docs_of("rbac.yaml");
    for role in [APP, "metal-ipam-event-source"] {
        let granted = granted(&find(&docs, "ClusterRole", role).value);
        let of = |plural: &str| -> BTreeSet<(String, String)> {
            granted
                .iter()
                .filter(|(g, r, _)| {
                    g == OUR_GROUP && (r == plural || r.starts_with(&format!("{plural}/")))
                })
                .map(|(_, r, v)| (r.replacen(plural, "*", 1), v.clone()))
                .collect()
        };
        for (ip, prefix) in [
            ("metalippools", "metalprefixpools"),
            ("globalmetalippools", "globalmetalprefixpools"),
        ] {
            assert!(!of(ip).is_empty(), "{role}: {ip}");
            assert_eq!(of(prefix), of(ip), "{role}: {prefix} vs {ip}");
        }
    }
}

#[test]
fn event_source_role_is_read_only_on_the_watched_kinds() {
    let docs = all_docs();
    let mut crds = our_crds();
    crds.extend(capi_crds());
    let source = &only(&docs, "ApiServerSource").value["spec"];
    let mut expected = BTreeSet::new();
    for r in source["resources"].as_array().unwrap() {
        let api_version = r["apiVersion"].as_str().unwrap();
        let group = api_version.split_once('/').unwrap().0;
        let plural = plural_of(&crds, api_version, r["kind"].as_str().unwrap());
        for verb in ["get", "list", "watch"] {
            expected.insert((group.to_string(), plural.clone(), verb.to_string()));
        }
    }
    let role = find(&docs, "ClusterRole", "metal-ipam-event-source");
    assert_eq!(granted(&role.value), expected);
    let sa = source["serviceAccountName"].as_str().unwrap();
    assert!(bound_service_accounts(&docs, "metal-ipam-event-source")
        .contains(&(NAMESPACE.to_string(), sa.to_string())));
}

// ---------------------------------------------------------------------------
// Event intake, webhook, reconcile
// ---------------------------------------------------------------------------

#[test]
fn api_server_source_sends_whole_objects_of_the_nine_kinds_to_events() {
    let docs = all_docs();
    let source = only(&docs, "ApiServerSource");
    assert_eq!(source.value["apiVersion"], "sources.knative.dev/v1");
    assert_eq!(source.namespace(), Some(NAMESPACE));
    let spec = &source.value["spec"];
    assert_eq!(spec["mode"], "Resource");
    // Without a namespaceSelector Knative watches only the source's own
    // namespace; an empty one means all namespaces.
    assert_eq!(spec["namespaceSelector"], json!({}));
    let kinds: BTreeSet<(String, String)> = spec["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r.get("selector").is_none(), "no label selector: {r}");
            (
                r["apiVersion"].as_str().unwrap().to_string(),
                r["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress"),
        ("ipam.metal-ipam.dev/v1alpha1", "MetalIPPool"),
        ("ipam.metal-ipam.dev/v1alpha1", "GlobalMetalIPPool"),
        ("ipam.metal-ipam.dev/v1alpha1", "MetalPrefixPool"),
        ("ipam.metal-ipam.dev/v1alpha1", "GlobalMetalPrefixPool"),
        ("cluster.x-k8s.io/v1beta2", "Machine"),
        ("ipam.metal-ipam.dev/v1alpha1", "MetalNetworkProfile"),
        ("infrastructure.cluster.x-k8s.io/v1beta1", "PacketMachine"),
    ]
    .iter()
    .map(|(a, k)| (a.to_string(), k.to_string()))
    .collect();
    assert_eq!(kinds, expected);
    assert_eq!(
        spec["sink"],
        json!({"uri": format!("{}/v1/events", service_url(&docs))})
    );
    // The token extension: the name metal-ipam reads, a valid CloudEvents
    // attribute name (lower-case letters and digits, at most 20).
    let extensions = spec["ceOverrides"]["extensions"].as_object().unwrap();
    assert_eq!(extensions.keys().collect::<Vec<_>>(), ["metalipamtoken"]);
    for name in extensions.keys() {
        assert!(
            name.len() <= 20
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }
}

#[test]
fn argo_alternative_covers_the_same_kinds_and_body_shape() {
    let docs = all_docs();
    let source = find(&docs, "EventSource", APP);
    let mut crds = our_crds();
    crds.extend(capi_crds());
    let watched: BTreeSet<(String, String, String)> = source.value["spec"]["resource"]
        .as_object()
        .unwrap()
        .values()
        .map(|r| {
            assert_eq!(r["namespace"], "", "watch every namespace: {r}");
            assert_eq!(
                string_set(&r["eventTypes"]),
                set(&["ADD", "UPDATE", "DELETE"])
            );
            (
                r["group"].as_str().unwrap().to_string(),
                r["version"].as_str().unwrap().to_string(),
                r["resource"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let knative = &only(&docs, "ApiServerSource").value["spec"]["resources"];
    let expected: BTreeSet<(String, String, String)> = knative
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let api_version = r["apiVersion"].as_str().unwrap();
            let (group, version) = api_version.split_once('/').unwrap();
            let plural = plural_of(&crds, api_version, r["kind"].as_str().unwrap());
            (group.to_string(), version.to_string(), plural)
        })
        .collect();
    assert_eq!(watched, expected);

    // One trigger per dependency, each POSTing {"type", "object"} with the
    // bearer header from a Secret.
    let sensor = &find(&docs, "Sensor", APP).value["spec"];
    let deps: BTreeSet<String> = sensor["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deps.len(), watched.len());
    let url = format!("{}/v1/events", service_url(&docs));
    let mut fired = BTreeSet::new();
    for trigger in sensor["triggers"].as_array().unwrap() {
        let template = &trigger["template"];
        let dep = template["conditions"].as_str().unwrap();
        assert!(deps.contains(dep));
        fired.insert(dep.to_string());
        let http = &template["http"];
        assert_eq!(http["url"], url.as_str());
        assert_eq!(http["method"], "POST");
        assert_eq!(http["secureHeaders"][0]["name"], "Authorization");
        let payload: BTreeMap<String, (String, String)> = http["payload"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["dest"].as_str().unwrap().to_string(),
                    (
                        p["src"]["dependencyName"].as_str().unwrap().to_string(),
                        p["src"]["dataKey"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect();
        assert_eq!(
            payload,
            BTreeMap::from([
                ("type".to_string(), (dep.to_string(), "type".to_string())),
                ("object".to_string(), (dep.to_string(), "body".to_string())),
            ])
        );
    }
    assert_eq!(fired, deps);
    // The Authorization Secret holds a whole header value.
    let auth = find(&docs, "Secret", "metal-ipam-events-auth");
    assert!(auth.value["stringData"]["authorization"]
        .as_str()
        .unwrap()
        .starts_with("Bearer "));
}

#[test]
fn webhook_validates_exactly_our_pools_over_https_with_the_token() {
    let docs = all_docs();
    let config = only(&docs, "ValidatingWebhookConfiguration");
    let hooks = config.value["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2, "pools and network profiles");
    let hook = &hooks[0];
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["timeoutSeconds"], 5);
    assert!(hook.get("namespaceSelector").is_none() && hook.get("objectSelector").is_none());

    let rules = hook["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    let crds: Vec<Crd> = our_crds()
        .into_iter()
        .filter(|c| c.kind() != "MetalNetworkProfile")
        .collect();
    assert_eq!(strings(&rule["apiGroups"]), [OUR_GROUP]);
    let plurals: BTreeSet<String> = crds.iter().map(|c| c.plural().to_string()).collect();
    assert_eq!(
        string_set(&rule["resources"]),
        plurals,
        "the four pool plurals, no subresources"
    );
    assert_eq!(
        string_set(&rule["operations"]),
        set(&["CREATE", "UPDATE", "DELETE"])
    );
    for version in strings(&rule["apiVersions"]) {
        for crd in &crds {
            assert!(
                crd.served_versions().contains(&version.as_str()),
                "{version}"
            );
        }
    }
    assert_eq!(
        rule["scope"], "*",
        "some pool kinds are namespaced, the others cluster-scoped"
    );

    // An HTTPS URL (the API server calls webhooks over TLS only; SpinKube
    // serves plain HTTP, so it cannot be a Service reference).
    let client = hook["clientConfig"].as_object().unwrap();
    assert!(client.get("service").is_none());
    let url = client["url"].as_str().unwrap();
    let rest = url.strip_prefix("https://").expect("https");
    let (host, path) = rest.split_once('/').unwrap();
    assert_eq!(format!("/{path}"), "/v1/admission/pools");

    // The Ingress in front of the SpinApp serves that host and only that path.
    let ingress = &find(&docs, "Ingress", "metal-ipam-webhook").value["spec"];
    assert_eq!(strings(&ingress["tls"][0]["hosts"]), [host]);
    let ingress_rules = ingress["rules"].as_array().unwrap();
    assert_eq!(ingress_rules.len(), 1);
    assert_eq!(ingress_rules[0]["host"], host);
    let paths = ingress_rules[0]["http"]["paths"].as_array().unwrap();
    let served: Vec<&str> = paths.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        served,
        ["/v1/admission/pools", "/v1/admission/network-profiles"]
    );
    for p in paths {
        assert_eq!(p["pathType"], "Exact");
        assert_eq!(
            p["backend"],
            json!({"service": {"name": APP, "port": {"number": 80}}})
        );
    }

    // The profile webhook: same host, its own path, profile writes only.
    let profiles = &hooks[1];
    assert_eq!(profiles["failurePolicy"], "Fail");
    assert_eq!(
        profiles["clientConfig"]["url"],
        format!("https://{host}/v1/admission/network-profiles")
    );
    let rule = &profiles["rules"][0];
    assert_eq!(strings(&rule["resources"]), ["metalnetworkprofiles"]);
    assert_eq!(
        string_set(&rule["operations"]),
        set(&["CREATE", "UPDATE", "DELETE"]),
        "a profile in use is not deleted"
    );

    // The kube-apiserver files: one kubeconfig user, matched by the same
    // host (never the catch-all "*"), referenced by the admission config.
    let admission = only(&docs, "AdmissionConfiguration");
    let plugin = admission.value["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ValidatingAdmissionWebhook")
        .expect("the ValidatingAdmissionWebhook plugin is configured");
    let kubeconfig_file = plugin["configuration"]["kubeConfigFile"].as_str().unwrap();
    assert!(kubeconfig_file.starts_with('/'));
    let kubeconfig = only(&docs, "Config");
    assert_eq!(kubeconfig.file, admission.file);
    let users = kubeconfig.value["users"].as_array().unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!(users[0]["name"], host);
    assert!(users[0]["user"]["token"].is_string());
}

#[test]
fn cron_job_posts_to_reconcile_every_five_minutes() {
    check_cron_job(
        "metal-ipam-reconcile",
        "*/5 * * * *",
        300,
        "RECONCILE_URL",
        "/v1/reconcile",
    );
}

#[test]
fn cron_job_polls_metal_events_every_minute() {
    check_cron_job(
        "metal-ipam-metal-poll",
        "* * * * *",
        60,
        "POLL_URL",
        "/v1/metal/poll",
    );
}

/// A CronJob that POSTs `path` with the API token on `schedule`, each run
/// ending within `period_s`.
fn check_cron_job(name: &str, schedule: &str, period_s: u64, url_var: &str, path: &str) {
    let docs = all_docs();
    let cron = find(&docs, "CronJob", name);
    let spec = &cron.value["spec"];
    assert_eq!(spec["schedule"], schedule);
    assert_eq!(spec["concurrencyPolicy"], "Forbid");
    let job = &spec["jobTemplate"]["spec"];
    assert!(
        job["activeDeadlineSeconds"].as_u64().unwrap() < period_s,
        "a run must end before the next is due"
    );
    let pod = &job["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    let env: BTreeMap<String, Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    assert_eq!(
        env[url_var]["value"],
        format!("{}{path}", service_url(&docs)).as_str()
    );
    // The same Secret and key as the SpinApp's api_token.
    let api_token = &spin_app_variables(&docs)["api_token"]["valueFrom"];
    assert_eq!(&env["API_TOKEN"]["valueFrom"], api_token);

    let script = strings(&c["command"]).join(" ");
    let url = format!("\"${url_var}\"");
    for needle in [
        "--fail-with-body",
        "--data",
        url.as_str(),
        "Authorization: Bearer",
        "$API_TOKEN",
    ] {
        assert!(
            script.contains(needle),
            "the command lacks {needle}: {script}"
        );
    }
    assert!(!script.contains("--insecure") && !script.contains(" -k "));
}

#[test]
fn placeholders_are_marked_for_operators() {
    // What must be changed before use says so, and nothing real is committed.
    let docs = all_docs();
    assert_eq!(
        spin_app(&docs)["spec"]["image"],
        "ghcr.io/example/metal-ipam:0.2.0"
    );
    let text = std::fs::read_to_string(deploy_dir().join("spinapp.yaml")).unwrap();
    assert!(
        text.contains("CHANGE THIS"),
        "spinapp.yaml must tell operators to change the image"
    );
    for d in docs
        .iter()
        .filter(|d| d.kind() == "Secret" && d.value["stringData"].is_object())
    {
        for (key, value) in d.value["stringData"].as_object().unwrap() {
            if key == "runtime-config.toml" {
                continue;
            }
            assert!(
                value.as_str().unwrap().contains("REPLACE-WITH"),
                "{}: {}/{key} looks real",
                d.file,
                d.name()
            );
        }
    }
    let token = &only(&docs, "ApiServerSource").value["spec"]["ceOverrides"]["extensions"]
        ["metalipamtoken"];
    assert!(token.as_str().unwrap().contains("REPLACE-WITH"));
}
