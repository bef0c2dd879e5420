//! Section 7: the Metal event poll through the components (the real
//! `.wasm` files on the in-process host, FakeKube, the Metal simulator):
//! `devices` devices with two claims each turn active in one window of
//! events, then are deleted; every `POST /v1/metal/poll` is timed, and its
//! claims, Kubernetes requests and Metal requests counted.

use std::time::Instant;

use anyhow::{ensure, Result};
use metal_ipam_core::capi::poll::MAX_POLL_CLAIMS;
use metal_ipam_core::provision::assign::LOST_ANSWER_S;
use metal_ipam_core::provision::plan::INTENT_LEASE_S;
use metal_ipam_tests::fake_kube::{FakeKube, IPAM_GROUP};
use metal_ipam_tests::harness::App;
use metal_ipam_tests::metal_sim::MetalSim;
use metal_ipam_tests::vrf_world::{claim, metal_app, pool_object, NS, POOL};
use serde_json::{json, Value};

use super::{f1, Table};

/// One phase: the polls it took and what they cost.
pub struct Phase {
    label: &'static str,
    calls: usize,
    claims: usize,
    ms: Vec<f64>,
    kube: usize,
    metal: usize,
}

impl Phase {
    fn json(&self) -> Value {
        json!({"phase": self.label, "calls": self.calls, "claims": self.claims,
               "ms": self.ms, "kube_requests": self.kube, "metal_requests": self.metal})
    }
}

fn device(n: usize) -> String {
    format!("6f1d2c3b-4a59-4e68-8f70-{n:012x}")
}

/// Polls until nothing is left; the phase's figures.
async fn polls(app: &App, kube: &FakeKube, sim: &MetalSim, label: &'static str) -> Result<Phase> {
    let (k0, m0) = (kube.requests().len(), sim.requests().len());
    let mut phase = Phase {
        label,
        calls: 0,
        claims: 0,
        ms: Vec::new(),
        kube: 0,
        metal: 0,
    };
    loop {
        let t = Instant::now();
        let r = app.call("POST", "/v1/metal/poll", None).await;
        phase.ms.push(t.elapsed().as_secs_f64() * 1000.0);
        ensure!(r.status == 200, "poll answered {}: {}", r.status, r.body);
        phase.calls += 1;
        phase.claims += r.body["synced"].as_array().map_or(0, Vec::len);
        if r.body["more"] != json!(true) {
            break;
        }
        ensure!(phase.calls < 20, "the poll does not finish");
    }
    phase.kube = kube.requests().len() - k0;
    phase.metal = sim.requests().len() - m0;
    Ok(phase)
}

/// Runs the section with `devices` devices (two claims each).
pub async fn run(devices: usize) -> Result<Vec<Phase>> {
    let kube = FakeKube::start().await;
    let sim = MetalSim::start().await;
    let app = metal_app(&kube, &sim);
    let mut pool = pool_object();
    pool["spec"]["metal"]["reservation"] = json!({"network": "10.10.4.0", "cidr": 22});
    kube.create(pool);
    for _ in 0..8 {
        let r = app
            .call("POST", &format!("/v1/metal/pools/{NS}/{POOL}"), None)
            .await;
        if r.status == 200 {
            break;
        }
    }
    for n in 0..devices {
        sim.add_device_in_state(&device(n), "da", 2, "provisioning");
        let m = kube.create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "PacketMachine",
            "metadata": {"name": format!("pm-{n}"), "namespace": NS},
            "spec": {"providerID": format!("equinixmetal://{}", device(n))}
        }));
        for k in 0..2 {
            let mut c = claim(&format!("m-{n}-{k}"));
            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "PacketMachine", "name": m["metadata"]["name"], "uid": m["metadata"]["uid"],
                "controller": true}]);
            let c = kube.create(c);
            let r = app
                .call(
                    "POST",
                    "/v1/events",
                    Some(&json!({"type": "ADDED", "object": c})),
                )
                .await;
            ensure!(r.status == 200, "claim event: {}", r.body);
        }
    }
    let first = polls(&app, &kube, &sim, "first poll (resync)").await?;
    for n in 0..devices {
        sim.set_device_state(&device(n), "active");
    }
    let active = polls(&app, &kube, &sim, "devices active").await?;
    ensure!(
        sim.assignments().len() == 2 * devices,
        "{} assignments",
        sim.assignments().len()
    );
    for n in 0..devices {
        sim.delete_device(&device(n));
    }
    let deleted = polls(&app, &kube, &sim, "devices deleted").await?;
    ensure!(
        kube.list(IPAM_GROUP, "ipaddressclaims").len() == 2 * devices,
        "claims kept"
    );
    Ok(vec![first, active, deleted])
}

/// Prints the section; its JSON.
pub fn print(devices: usize, phases: &[Phase]) -> Value {
    let mut t = Table::new(
        format!("7. Metal poll, {devices} devices with 2 claims each (component host, simulator)"),
        &[
            "phase",
            "polls",
            "claims",
            "claims/poll",
            "ms/poll mean",
            "ms/poll max",
            "Kubernetes req/claim",
            "Metal req/claim",
        ],
    );
    for p in phases {
        let per = |x: usize| {
            if p.claims == 0 {
                "-".to_string()
            } else {
                f1(x as f64 / p.claims as f64)
            }
        };
        let mean = p.ms.iter().sum::<f64>() / p.ms.len().max(1) as f64;
        let max = p.ms.iter().copied().fold(0.0, f64::max);
        t.row(vec![
            p.label.to_string(),
            p.calls.to_string(),
            p.claims.to_string(),
            f1(p.claims as f64 / p.calls.max(1) as f64),
            f1(mean),
            f1(max),
            per(p.kube),
            per(p.metal),
        ]);
    }
    t.note(format!(
        "at most {MAX_POLL_CLAIMS} claim steps per poll; the cursor moves past every event read by the first call"
    ));
    t.note(format!(
        "a lost assignment answer is retried after {LOST_ANSWER_S} s (a crashed instance's intent after {INTENT_LEASE_S} s); a deleting claim whose device vanished finishes at once once a poll saw the deletion, else within those"
    ));
    t.print();
    json!({"devices": devices, "phases": phases.iter().map(Phase::json).collect::<Vec<_>>()})
}
