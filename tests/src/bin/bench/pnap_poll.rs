//! Section 9: the phoenixNAP poll through the components (the real `.wasm`
//! files on the in-process host, FakeKube, the phoenixNAP simulator):
//! `servers` servers in PHX with two claims each on a pool backed by a
//! private network it created, assigned as `pnap_world` does (claim
//! created, its `ADDED` event delivered, the assign route settled). The
//! first poll sets the cursor (a resync of every known server); then a
//! quiet poll (no new events: one audit log read), and a poll after one
//! server was deleted (one new event: every known server re-read, within
//! the poll's budget, until `more` is false). Every `POST /v1/metal/poll`
//! is timed; its phoenixNAP and Kubernetes requests counted and checked
//! (the counts are deterministic, the timings are only printed).

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use metal_ipam_core::capi::poll::MAX_POLL_CLAIMS;
use metal_ipam_tests::fake_kube::{FakeKube, IPAM_GROUP};
use metal_ipam_tests::harness::{App, Runtime};
use metal_ipam_tests::kube::Kube;
use metal_ipam_tests::pnap_sim::{PnapSim, TOKEN_ROUTE};
use metal_ipam_tests::pnap_world::{pnap_vars, pool_object, World, LOCATION, NS};
use serde_json::{json, Value};

use super::{f1, Table};

/// The pool of the section.
const POOL: &str = "priv";
/// Claims per server.
const CLAIMS_PER_SERVER: usize = 2;
/// The phoenixNAP operation of a server read.
const SERVER_READ: &str = "serversServerIdGet";
/// The phoenixNAP operation of an audit log read.
const EVENTS_READ: &str = "eventsGet";
/// Polls one phase may take before the bench gives up.
const MAX_CALLS: usize = 20;

/// Server `n`'s id (phoenixNAP's are 24 hex digits).
fn server(n: usize) -> String {
    format!("60473a6115e34466c9f8{n:04x}")
}

/// Claim `k` of server `n`.
fn claim_name(n: usize, k: usize) -> String {
    format!("s{n}-{k}")
}

/// One phase: the polls it took and what they cost.
pub struct Phase {
    label: &'static str,
    calls: usize,
    ms: Vec<f64>,
    /// Audit log reads.
    events_reads: usize,
    /// Server reads.
    server_reads: usize,
    /// Token requests.
    tokens: usize,
    /// Every phoenixNAP request (tokens included).
    pnap: usize,
    kube: usize,
    /// Kubernetes requests other than reads.
    kube_writes: usize,
    /// Servers read, as the answers report them.
    devices: usize,
    /// Claims re-run (`synced`).
    synced: usize,
    /// Claims told their server was deleted (`deviceDeleted`).
    marked: usize,
    /// The first answer said `resync`.
    resync: bool,
}

impl Phase {
    fn total_ms(&self) -> f64 {
        self.ms.iter().sum()
    }

    fn json(&self) -> Value {
        json!({"phase": self.label, "calls": self.calls, "ms": self.ms,
               "events_reads": self.events_reads, "server_reads": self.server_reads,
               "token_requests": self.tokens, "pnap_requests": self.pnap,
               "kube_requests": self.kube, "kube_writes": self.kube_writes, "synced": self.synced,
               "device_deleted": self.marked, "resync": self.resync})
    }
}

/// Polls until phoenixNAP's `more` is false; the phase's figures.
async fn polls(w: &World, label: &'static str) -> Result<Phase> {
    let (k0, p0) = (w.kube.requests().len(), w.sim.requests().len());
    let mut phase = Phase {
        label,
        calls: 0,
        ms: Vec::new(),
        events_reads: 0,
        server_reads: 0,
        tokens: 0,
        pnap: 0,
        kube: 0,
        kube_writes: 0,
        devices: 0,
        synced: 0,
        marked: 0,
        resync: false,
    };
    loop {
        let t = Instant::now();
        let r = w.app.call("POST", "/v1/metal/poll", None).await;
        phase.ms.push(t.elapsed().as_secs_f64() * 1000.0);
        ensure!(r.status == 200, "poll answered {}: {}", r.status, r.body);
        let p = &r.body["phoenixnap"];
        ensure!(
            p["errors"].as_array().is_some_and(Vec::is_empty),
            "poll errors: {p}"
        );
        if phase.calls == 0 {
            phase.resync = p["resync"] == json!(true);
        }
        phase.calls += 1;
        phase.devices += p["devices"].as_u64().context("devices")? as usize;
        phase.synced += p["synced"].as_array().map_or(0, Vec::len);
        phase.marked += p["deviceDeleted"].as_array().map_or(0, Vec::len);
        if p["more"] != json!(true) {
            break;
        }
        ensure!(phase.calls < MAX_CALLS, "the poll does not finish: {p}");
    }
    let kreqs = w.kube.requests();
    phase.kube = kreqs.len() - k0;
    phase.kube_writes = kreqs[k0..].iter().filter(|r| r.method != "GET").count();
    let reqs = w.sim.requests();
    let new = &reqs[p0..];
    let op = |o: &str| {
        new.iter()
            .filter(|r| r.operation.as_deref() == Some(o))
            .count()
    };
    phase.pnap = new.len();
    phase.tokens = op(TOKEN_ROUTE);
    phase.server_reads = op(SERVER_READ);
    phase.events_reads = op(EVENTS_READ);
    ensure!(
        phase.pnap == phase.tokens + phase.server_reads + phase.events_reads,
        "{label}: phoenixNAP requests other than tokens, server and audit log reads: {:?}",
        new.iter().map(|r| r.line()).collect::<Vec<_>>()
    );
    Ok(phase)
}

/// The section's figures.
pub struct Figures {
    servers: usize,
    phases: Vec<Phase>,
}

/// Checks one phase's deterministic counts: `calls` polls, each one audit
/// log read and one token; `reads` server reads (each known server once,
/// reported as read); `marked` claims told; `synced` claims re-run. On
/// Kubernetes: a call that reads servers lists the Machines once and reads
/// each claim it syncs; a claim marked is one status write.
fn check(p: &Phase, calls: usize, reads: usize, marked: usize, synced: usize) -> Result<()> {
    let got = (
        p.calls,
        p.events_reads,
        p.tokens,
        p.server_reads,
        p.devices,
        p.marked,
        p.synced,
    );
    let want = (calls, calls, calls, reads, reads, marked, synced);
    ensure!(
        got == want,
        "{}: (polls, audit reads, tokens, server reads, servers read, claims marked, claims synced) = {got:?}, expected {want:?}",
        p.label
    );
    let lists = if reads == 0 { 0 } else { calls };
    let kube = (p.kube, p.kube_writes);
    let want = (lists + synced + marked, marked);
    ensure!(
        kube == want,
        "{}: (Kubernetes requests, writes) = {kube:?}, expected {want:?}",
        p.label
    );
    Ok(())
}

/// Runs the section with `servers` servers (two claims each).
pub async fn run(servers: usize) -> Result<Figures> {
    let kube = Kube::Fake(FakeKube::start().await);
    let sim = PnapSim::start().await;
    for n in 0..servers {
        sim.add_server(&server(n), &format!("node-{n}"), LOCATION);
    }
    let app = App::on(Runtime::Host, &pnap_vars(&kube, &sim), &[])
        .await
        .context("the test host")?;
    let w = World {
        kube,
        sim,
        app,
        runtime: Runtime::Host,
    };
    w.kube.create(pool_object(
        POOL,
        json!({"location": LOCATION, "privateNetwork": {"cidr": "10.20.0.0/24"}}),
    ));
    w.provision(POOL).await;
    for n in 0..servers {
        for k in 0..CLAIMS_PER_SERVER {
            let c = claim_name(n, k);
            w.claim(&c, POOL, &server(n)).await;
            w.assign(&c).await;
        }
    }
    let claims = CLAIMS_PER_SERVER * servers;
    // Whole servers per call within the claim budget.
    let per_call = (MAX_POLL_CLAIMS / CLAIMS_PER_SERVER).max(1);
    let resync_calls = servers.div_ceil(per_call).max(1);

    // The first poll sets the cursor: a resync of every known server.
    let first = polls(&w, "first poll (sets the cursor)").await?;
    ensure!(first.resync, "the first poll did not resync");
    check(&first, resync_calls, servers, 0, claims)?;

    // (a) Nothing happened: one audit log read (and a token), nothing else.
    let quiet = polls(&w, "quiet (no new events)").await?;
    ensure!(!quiet.resync, "the quiet poll resynced");
    check(&quiet, 1, 0, 0, 0)?;

    // (b) A second later (the audit log's `from` is inclusive), one server
    // is deleted: its event makes the poll re-read every known server. Every
    // claim is synced, the deleted server's two as `DeviceDeleted`.
    w.sim.advance(1_000);
    let victim = server(0);
    w.sim.delete_server(&victim);
    let deleted = polls(&w, "one server deleted").await?;
    ensure!(deleted.resync, "the deletion did not resync");
    check(&deleted, resync_calls, servers, CLAIMS_PER_SERVER, claims)?;

    // The claims marked are the deleted server's, and they are kept.
    let marked: Vec<String> = w
        .kube
        .list(IPAM_GROUP, "ipaddressclaims")
        .iter()
        .filter(|c| World::condition(c, "MetalAssigned").1 == "DeviceDeleted")
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let want: Vec<String> = (0..CLAIMS_PER_SERVER).map(|k| claim_name(0, k)).collect();
    ensure!(
        marked.len() == CLAIMS_PER_SERVER && want.iter().all(|c| marked.contains(c)),
        "claims marked DeviceDeleted: {marked:?}, expected {want:?}"
    );
    ensure!(
        w.kube.list(IPAM_GROUP, "ipaddressclaims").len() == claims,
        "claims kept"
    );
    ensure!(
        want.iter()
            .all(|c| w.kube.get(IPAM_GROUP, "ipaddresses", Some(NS), c).is_some()),
        "a marked claim's address was released"
    );
    w.assert_clean();
    Ok(Figures {
        servers,
        phases: vec![first, quiet, deleted],
    })
}

/// Prints the section; its JSON.
pub fn print(f: &Figures) -> Value {
    let mut t = Table::new(
        format!(
            "9. phoenixNAP poll, {} servers with {CLAIMS_PER_SERVER} claims each (component host, simulator)",
            f.servers
        ),
        &[
            "phase",
            "polls",
            "ms total",
            "ms/poll max",
            "server reads",
            "phoenixNAP req",
            "Kubernetes req",
            "claims synced",
            "claims DeviceDeleted",
            "servers read/s",
        ],
    );
    for p in &f.phases {
        let total = p.total_ms();
        let max = p.ms.iter().copied().fold(0.0, f64::max);
        let rate = if p.server_reads == 0 || total <= 0.0 {
            "-".to_string()
        } else {
            f1(p.server_reads as f64 / (total / 1000.0))
        };
        t.row(vec![
            p.label.to_string(),
            p.calls.to_string(),
            f1(total),
            f1(max),
            p.server_reads.to_string(),
            format!("{} ({} audit, {} token)", p.pnap, p.events_reads, p.tokens),
            format!("{} ({} writes)", p.kube, p.kube_writes),
            p.synced.to_string(),
            p.marked.to_string(),
            rate,
        ]);
    }
    t.note(format!(
        "new audit log events make the poll re-read every known server (one GET each), at most {MAX_POLL_CLAIMS} claim steps per call (whole servers: {} with {CLAIMS_PER_SERVER} claims), `more` until all are read",
        MAX_POLL_CLAIMS / CLAIMS_PER_SERVER
    ));
    t.note("each poll is a fresh component instance: one token request and one audit log read per call; counts are checked, timings only printed");
    t.print();
    json!({"servers": f.servers, "claims_per_server": CLAIMS_PER_SERVER,
           "phases": f.phases.iter().map(Phase::json).collect::<Vec<_>>()})
}
