//! The `network` component on the test host, from the real `.wasm` files,
//! against the fake Kubernetes API and the Metal simulator: a Machine opts
//! into a profile; `?dryRun=true` answers the plan and changes nothing;
//! POSTs apply it (202 with `Retry-After` and `Location` while a step runs)
//! until the device is as the profile says, doing exactly the dry-run plan;
//! a converged POST makes no mutating Metal call; the node's configuration
//! renders in each format; errors are clear. Every test but the one that
//! traces service chaining (a test-host report) runs on real Spin too when
//! `SPIN_BIN` is given (`spin_sqlite::`, `spin_redis::`): the VLAN batches
//! then go through Spin's own chaining to the private `attach-vlan` and
//! `detach-vlan` components.

use metal_ipam_tests::fake_kube::FakeKube;
use metal_ipam_tests::harness::{given, App, Runtime};
use metal_ipam_tests::metal_sim::{MetalSim, SimConfig};
use metal_ipam_tests::vrf_world::metal_app_on;
use serde_json::{json, Value};

const DEV: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a";

async fn setup(runtime: Runtime) -> (FakeKube, MetalSim, App) {
    let kube = FakeKube::start().await;
    let sim = MetalSim::start_with(SimConfig::default()).await.unwrap();
    sim.add_device(DEV, "da", 2);
    sim.create_vlans("da", &[1010, 1011]).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": "l2", "namespace": "team-a"},
        "spec": {"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": [{"vxlan": 1010, "addresses": [{"static": "192.168.10.5/24"}]},
                      {"vxlan": 1011, "addresses": [{"pool": {"name": "nodes"}}],
                       "routes": [{"to": "10.20.0.0/16", "via": "192.168.11.1"}]}],
            "nativeVLAN": {"vxlan": 1010}}]}
    }));
    // The machines' Cluster (their claims are labelled with it).
    kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": "team-a"}, "spec": {}}),
    );
    let pool = kube.create(json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": "nodes", "namespace": "team-a"},
        "spec": {"addresses": ["192.168.11.10-192.168.11.20"], "prefix": 24, "gateway": "192.168.11.1"}
    }));
    let r = app
        .call(
            "POST",
            "/v1/events",
            Some(&json!({"type": "ADDED", "object": pool})),
        )
        .await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-0", "namespace": "team-a",
            "annotations": {"ipam.metal-ipam.dev/network-profile": "l2"}},
        "spec": {"clusterName": "c", "providerID": format!("equinixmetal://{DEV}")}
    }));
    (kube, sim, app)
}

/// The claim the profile made for m-0 (VLAN 1011's address from `nodes`),
/// found by the label that names the machine.
fn profile_claim(kube: &FakeKube) -> Option<Value> {
    kube.list(metal_ipam_tests::fake_kube::IPAM_GROUP, "ipaddressclaims")
        .into_iter()
        .find(|c| c["metadata"]["labels"]["ipam.metal-ipam.dev/network-machine"] == "m-0")
}

fn steps(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["port"].as_str().unwrap(),
                s["action"].as_str().unwrap()
            )
        })
        .collect()
}

async fn a_machine_profile_is_planned_applied_and_rendered(runtime: Runtime) {
    let (kube, sim, app) = setup(runtime).await;
    sim.clear_requests();
    let path = "/v1/machines/team-a/m-0/network";

    // Dry run: the plan, and no Metal write.
    let r = app.call("POST", &format!("{path}?dryRun=true"), None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    let planned = steps(&r.body["plan"]);
    assert_eq!(
        planned,
        [
            "bond0 convert-layer2",
            "bond0 assign-vlans",
            "bond0 set-native-vlan"
        ]
    );
    assert_eq!(r.body["modes"]["bond0"], "layer2-bonded");
    assert!(sim.requests().iter().all(|q| q.method == "GET"));

    // Apply: 202s while steps run, then 200; what it issued is the plan.
    let mut issued = Vec::new();
    let mut last = None;
    for _ in 0..20 {
        let r = app.call("POST", path, None).await;
        issued.extend(steps(&r.body["issued"]));
        if r.status == 200 {
            last = Some(r);
            break;
        }
        assert_eq!(r.status, 202, "{:#}", r.body);
        assert_eq!(r.headers["location"], path);
        assert!(r.headers.get("retry-after").is_some());
    }
    let r = last.expect("converged");
    assert_eq!(r.body["phase"], "converged");
    assert_eq!(issued, planned, "apply did the dry-run plan");
    let d = sim.device(DEV).unwrap();
    let bond = d.port("bond0").unwrap();
    assert!(bond.layer2 && bond.bonded && bond.vlans.len() == 2 && bond.native_vlan.is_some());

    // Converged: no mutating call.
    sim.clear_requests();
    let r = app.call("POST", path, None).await;
    assert_eq!((r.status, &r.body["phase"]), (200, &json!("converged")));
    assert!(sim.requests().iter().all(|q| q.method == "GET"));

    // The apply created the per-VLAN claim, owned by the Machine; until it
    // is bound its address is pending.
    let claim = profile_claim(&kube).expect("the claim of VLAN 1011's address");
    let name = claim["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("m-0-bond0-vlan-"), "{name}");
    assert_eq!(claim["metadata"]["ownerReferences"][0]["kind"], "Machine");
    assert_eq!(claim["spec"]["poolRef"]["name"], "nodes");
    let cfg = "/v1/machines/team-a/m-0/netconfig";
    let r = app.call("GET", &format!("{cfg}?format=shell"), None).await;
    assert_eq!(r.headers["x-metal-ipam-pending"], "1");
    // The claim's event binds it through the allocator.
    let r = app
        .call(
            "POST",
            "/v1/events",
            Some(&json!({"type": "ADDED", "object": claim})),
        )
        .await;
    assert_eq!(r.body["stepResult"]["result"], "bound", "{:#}", r.body);

    // The node's configuration: the native VLAN untagged on bond0, the
    // other tagged, with the allocated address and its route.
    let r = app.call("GET", &format!("{cfg}?format=shell"), None).await;
    assert_eq!(r.headers["x-metal-ipam-pending"], "0");
    assert!(
        r.text()
            .contains("ip addr replace 192.168.11.10/24 dev bond0.1011"),
        "{}",
        r.text()
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/x-shellscript");
    let text = r.text();
    assert!(
        text.contains("ip addr replace 192.168.10.5/24 dev bond0"),
        "{text}"
    );
    assert!(text.contains("name bond0.1011 type vlan id 1011"), "{text}");
    assert!(
        text.contains("ip route replace 10.20.0.0/16 via 192.168.11.1"),
        "{text}"
    );
    for format in ["netplan", "ifupdown", "cloud-init"] {
        let r = app
            .call("GET", &format!("{cfg}?format={format}"), None)
            .await;
        assert_eq!(r.status, 200, "{format}");
        assert!(r.text().contains("1011"), "{format}");
    }
    let r = app.call("GET", &format!("{cfg}?format=yaml"), None).await;
    assert_eq!(r.status, 400);
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("network-data")),
        "{:#}",
        r.body
    );

    // The whole configuration as OpenStack network_data.json: the ports by
    // MAC, the layer2 bond with both members, the native VLAN's address
    // on it, the other VLAN tagged with its pool address and route.
    let r = app
        .call("GET", &format!("{cfg}?format=network-data"), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let nd: Value = serde_json::from_str(&r.text()).expect("JSON");
    let links = nd["links"].as_array().unwrap();
    let link = |id: &str| links.iter().find(|l| l["id"] == id).cloned();
    for eth in ["eth0", "eth1"] {
        let l = link(eth).unwrap_or_else(|| panic!("{eth}: {nd:#}"));
        assert_eq!(l["type"], "phy");
        assert!(l["ethernet_mac_address"].is_string(), "{nd:#}");
    }
    let bond = link("bond0").unwrap();
    assert_eq!(bond["bond_links"], json!(["eth0", "eth1"]));
    assert_eq!(bond["bond_mode"], "802.3ad");
    let vlan = link("bond0.1011").unwrap();
    assert_eq!(
        (&vlan["vlan_link"], &vlan["vlan_id"]),
        (&json!("bond0"), &json!(1011))
    );
    let nets = nd["networks"].as_array().unwrap();
    let on = |link: &str, ip: &str| {
        nets.iter()
            .any(|n| n["link"] == link && n["ip_address"] == ip)
    };
    assert!(
        on("bond0", "192.168.10.5") && on("bond0.1011", "192.168.11.10"),
        "{nd:#}"
    );
    assert_eq!(nd["services"], json!([]));

    // Release: the device back to layer3 without VLANs (202s while that
    // runs), then the per-VLAN claim deleted; once more changes nothing.
    let mut last = None;
    for _ in 0..20 {
        let r = app.call("DELETE", path, None).await;
        if r.status == 200 {
            last = Some(r);
            break;
        }
        assert_eq!(r.status, 202, "{:#}", r.body);
    }
    let r = last.expect("released");
    assert_eq!(r.body["claimsDeleted"], 1, "{:#}", r.body);
    let d = sim.device(DEV).unwrap();
    let bond = d.port("bond0").unwrap();
    assert!(!bond.layer2 && bond.bonded && bond.vlans.is_empty() && bond.native_vlan.is_none());
    assert!(d.ports.iter().all(|p| p.bonded && p.vlans.is_empty()));
    let claim = profile_claim(&kube);
    assert!(
        claim.is_none_or(|c| c["metadata"]["deletionTimestamp"].is_string()),
        "the claim is deleted (its finalizer releases the address)"
    );
    sim.clear_requests();
    let r = app.call("DELETE", path, None).await;
    assert_eq!((r.status, &r.body["claimsDeleted"]), (200, &json!(0)));
    assert!(sim.requests().iter().all(|q| q.method == "GET"));
    assert_eq!(sim.violations(), Vec::<String>::new());
}

async fn machines_without_a_profile_or_a_device_get_clear_errors(runtime: Runtime) {
    let (kube, _sim, app) = setup(runtime).await;
    kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "plain", "namespace": "team-a"}, "spec": {"clusterName": "c"}
    }));
    kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "new", "namespace": "team-a",
            "annotations": {"ipam.metal-ipam.dev/network-profile": "l2"}},
        "spec": {"clusterName": "c"}
    }));
    let post = |p: &'static str| app.call("POST", p, None);
    let r = post("/v1/machines/team-a/plain/network").await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("NoNetworkProfile"))
    );
    let r = post("/v1/machines/team-a/new/network").await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("DeviceUnknown"))
    );
    // Its configuration renders before the device exists.
    let r = app
        .call("GET", "/v1/machines/team-a/new/netconfig", None)
        .await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().starts_with("# Generated by metal-ipam"),
        "{}",
        r.text()
    );
    // network_data.json needs the device's MACs: a clear 409 until then.
    let r = app
        .call(
            "GET",
            "/v1/machines/team-a/new/netconfig?format=network-data",
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("DeviceUnknown")),
        "{:#}",
        r.body
    );
    let r = post("/v1/machines/team-a/gone/network").await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (404, Some("MachineNotFound"))
    );
    assert_eq!(
        app.call_with("POST", "/v1/machines/team-a/m-0/network", None, None)
            .await
            .status,
        401
    );
    assert_eq!(
        app.call("GET", "/v1/machines/team-a/m-0/network", None)
            .await
            .status,
        405
    );
    assert_eq!(
        app.call("POST", "/v1/machines/Team_A/m-0/network", None)
            .await
            .status,
        400
    );
}

/// Metal has no webhooks: when the Metal poll sees the machine's device
/// become active, it applies the machine's profile, and the next polls
/// continue it while a step runs, until it converges.
async fn the_metal_poll_applies_a_profile_when_the_device_becomes_active(runtime: Runtime) {
    let (_kube, sim, app) = setup(runtime).await;
    sim.set_device_state(DEV, "provisioning");
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(r.body["network"], json!([]));
    sim.set_device_state(DEV, "active");
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["network"][0]["machine"], "team-a/m-0",
        "{:#}",
        r.body
    );
    assert!(
        sim.requests()
            .iter()
            .any(|q| q.operation.as_deref() == Some("convertLayer2")),
        "the apply started"
    );
    // Later polls continue the apply (its step is running; no new event
    // for the device) until it converges; nobody POSTs.
    let mut phases = Vec::new();
    for _ in 0..20 {
        let r = app.call("POST", "/v1/metal/poll", None).await;
        assert_eq!(r.status, 200, "{:#}", r.body);
        let phase = r.body["network"][0]["phase"].clone();
        phases.push(phase.clone());
        if phase == "converged" {
            break;
        }
    }
    assert_eq!(phases.last(), Some(&json!("converged")), "{phases:?}");
    assert!(sim.device(DEV).unwrap().port("bond0").unwrap().layer2);
    // Converged: the next poll has nothing to continue.
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.body["network"], json!([]), "{:#}", r.body);
    let r = app
        .call("POST", "/v1/machines/team-a/m-0/network", None)
        .await;
    assert_eq!((r.status, &r.body["phase"]), (200, &json!("converged")));
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// Sends `method path` with the token and returns the status, the body and
/// the service chaining requests it made.
async fn traced(
    app: &App,
    method: &str,
    path: &str,
) -> (u16, Value, Vec<metal_ipam_host::ChainedCall>) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            "authorization",
            format!("Bearer {}", metal_ipam_tests::harness::TOKEN),
        )
        .body(Vec::new())
        .unwrap();
    let out = app.host().handle(req).await.unwrap();
    let body = serde_json::from_slice(out.response.body()).unwrap_or(Value::Null);
    (out.response.status().as_u16(), body, out.chained)
}

/// The VLAN batches go through their own components: `attach-vlan` for the
/// apply's batch, `detach-vlan` for the release's, reached only by service
/// chaining (no public route); every batch Metal saw came from one of them,
/// one create each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vlan_batches_run_in_the_attach_and_detach_components() {
    let (_kube, sim, app) = setup(Runtime::Host).await;
    let path = "/v1/machines/team-a/m-0/network";
    let batch_posts = |sim: &MetalSim| {
        sim.requests()
            .iter()
            .filter(|q| q.method == "POST" && q.path.ends_with("/vlan-assignments/batches"))
            .count()
    };
    let run = |method: &'static str| {
        let app = &app;
        async move {
            let mut chained = Vec::new();
            for _ in 0..20 {
                let (status, body, c) = traced(app, method, path).await;
                chained.extend(c);
                if status == 200 {
                    return chained;
                }
                assert_eq!(status, 202, "{body:#}");
            }
            panic!("{method} did not converge");
        }
    };
    sim.clear_requests();
    let chained = run("POST").await;
    let attach: Vec<_> = chained
        .iter()
        .filter(|c| c.component == "attach-vlan")
        .collect();
    assert!(!attach.is_empty(), "the batch went through attach-vlan");
    assert!(attach.iter().all(|c| c.caller == "network"
        && c.status == 200
        && c.path.ends_with("/vlan-batches")
        && c.method == http::Method::POST));
    assert!(chained.iter().all(|c| c.component != "detach-vlan"));
    assert_eq!(batch_posts(&sim), 1, "one batch for both VLANs");

    sim.clear_requests();
    let chained = run("DELETE").await;
    let detach = chained
        .iter()
        .filter(|c| c.component == "detach-vlan")
        .count();
    assert!(detach >= 1, "the release's batch went through detach-vlan");
    assert!(chained.iter().all(|c| c.component != "attach-vlan"));
    assert_eq!(batch_posts(&sim), 1);
    assert!(sim
        .device(DEV)
        .unwrap()
        .port("bond0")
        .unwrap()
        .vlans
        .is_empty());

    // Private: no public route reaches the batch steps.
    let port = sim.device(DEV).unwrap().port("bond0").unwrap().id.clone();
    let r = app
        .call(
            "POST",
            &format!("/v1/metal/ports/{port}/vlan-batches"),
            Some(&json!({"op": "find"})),
        )
        .await;
    assert_eq!(r.status, 404, "{:#}", r.body);
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// A deleted device (seen by the Metal poll) releases its Machine's
/// network: the per-VLAN claims are deleted and the device's apply record
/// is forgotten.
async fn the_metal_poll_releases_the_network_of_a_deleted_device(runtime: Runtime) {
    let (kube, sim, app) = setup(runtime).await;
    let path = "/v1/machines/team-a/m-0/network";
    for _ in 0..20 {
        if app.call("POST", path, None).await.status == 200 {
            break;
        }
    }
    let store = app.store().await;
    let key = format!("net/device/{DEV}");
    assert!(store.get(&key).await.unwrap().is_some(), "the apply record");
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    sim.delete_device(DEV);
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["network"],
        json!([{"machine": "team-a/m-0", "phase": "released"}]),
        "{:#}",
        r.body
    );
    assert_eq!(r.body["networkClaimsDeleted"], 1);
    let claim = profile_claim(&kube);
    assert!(claim.is_none_or(|c| c["metadata"]["deletionTimestamp"].is_string()));
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "the record is forgotten"
    );
    // The event again (a poll that lost its cursor): nothing more to do.
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// The Machine `team-a/m-0` as the API server has it.
fn machine(kube: &FakeKube) -> Value {
    kube.get(
        metal_ipam_tests::fake_kube::CLUSTER_GROUP,
        "machines",
        Some("team-a"),
        "m-0",
    )
    .expect("the Machine")
}

/// Delivers the Machine's watch event until the step stops asking for it
/// again (the events component answers 503 with `Retry-After` while the
/// network step is at work); returns the step's last result.
async fn deliver_machine_event(app: &App, kube: &FakeKube) -> Value {
    for _ in 0..20 {
        let m = machine(kube);
        let r = app
            .call(
                "POST",
                "/v1/events",
                Some(&json!({"type": "MODIFIED", "object": m})),
            )
            .await;
        assert_eq!(r.body["step"], "network", "{:#}", r.body);
        if r.status == 200 {
            return r.body["stepResult"].clone();
        }
        assert_eq!(
            (r.status, r.body["stepStatus"].as_u64()),
            (503, Some(202)),
            "{:#}",
            r.body
        );
        assert!(r.headers.get("retry-after").is_some());
    }
    panic!("the Machine's event was never done");
}

/// Machine events (the forwarders watch Machines): an event applies the
/// profile (delivered again while a step runs, until converged); removing
/// the annotation releases the device and the claims and forgets the
/// record; from then on, events about the Machine make no Metal call.
async fn machine_events_apply_a_profile_and_release_it_once_removed(runtime: Runtime) {
    let (kube, sim, app) = setup(runtime).await;
    let result = deliver_machine_event(&app, &kube).await;
    assert_eq!(result["result"], "converged", "{result:#}");
    let bond = sim.device(DEV).unwrap().port("bond0").unwrap().clone();
    assert!(bond.layer2 && bond.vlans.len() == 2);
    let store = app.store().await;
    let key = format!("net/device/{DEV}");
    assert!(store.get(&key).await.unwrap().is_some());

    // The profile removed: the annotation dropped.
    let mut m = machine(&kube);
    m["metadata"]["annotations"] = json!({});
    kube.put(m);
    let result = deliver_machine_event(&app, &kube).await;
    assert_eq!(result["result"], "released", "{result:#}");
    assert_eq!(result["claimsDeleted"], 1);
    let d = sim.device(DEV).unwrap();
    assert!(d
        .ports
        .iter()
        .all(|p| p.bonded && p.vlans.is_empty() && !p.layer2));
    assert!(store.get(&key).await.unwrap().is_none(), "record forgotten");

    // Later events about the Machine: nothing to do, no Metal call, one
    // read of the Machine.
    sim.clear_requests();
    kube.clear_requests();
    let result = deliver_machine_event(&app, &kube).await;
    assert_eq!(result["result"], "ignored", "{result:#}");
    assert!(sim.requests().is_empty(), "{:?}", sim.requests());
    let reads: Vec<String> = kube.requests().iter().map(|r| r.line()).collect();
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(sim.violations(), Vec::<String>::new());
}

metal_ipam_tests::on_every_runtime!(
    given: a_machine_profile_is_planned_applied_and_rendered,
    machines_without_a_profile_or_a_device_get_clear_errors,
    the_metal_poll_applies_a_profile_when_the_device_becomes_active,
    the_metal_poll_releases_the_network_of_a_deleted_device,
    machine_events_apply_a_profile_and_release_it_once_removed,
);
