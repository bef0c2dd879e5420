//! The Metal event poll when Metal fails reads of some devices (issue 26,
//! finding 8), natively on the injected clock: a device whose reads keep
//! failing backs off and holds no other device; Metal failing every device
//! read stops the call after two; a failure that is not the device's stops
//! it at once and backs nothing off. Against the fake Kubernetes API and
//! the Metal simulator (its faults injected per device), each poll run as
//! an instance would at a given time (`vrf_world::World`).

use metal_ipam_core::capi::poll::{poll, PollReport, DOWN_AFTER};
use metal_ipam_core::capi::StepResult;
use metal_ipam_core::cloud::CloudKind;
use metal_ipam_core::error::{Error, Result};
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::observe::{metrics, summary};
use metal_ipam_core::provision::poll::{self as cursor, BACKOFF_BASE_S};
use metal_ipam_core::testing::Backend;
use metal_ipam_tests::metal_sim::{Fault, MetalSim};
use metal_ipam_tests::vrf_world::{assigned, device, pool_object, World, NS};

async fn ready() -> World {
    let w = World::new(Backend::SpinSqlite).await;
    w.kube.create(pool_object());
    let (o, _) = w.sync_until_settled(6).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    w
}

async fn try_poll(w: &World, now: u64) -> Result<PollReport> {
    w.spawn(now, |r| {
        poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
    })
    .await
    .unwrap()
}

async fn poll_at(w: &World, now: u64) -> PollReport {
    try_poll(w, now).await.unwrap()
}

/// Reads of device `n` Metal received.
fn reads(sim: &MetalSim, n: usize) -> usize {
    let path = format!("/devices/{}", device(n));
    sim.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&path))
        .count()
}

/// Every read of device `n` fails with `status`.
fn failing(sim: &MetalSim, n: usize, status: u16) {
    let path = format!("/devices/{}", device(n));
    sim.inject("GET", &path, Fault::Status(status), usize::MAX);
}

/// The device `n` as the poll's record has it pending.
fn pending(w: &World, n: usize) -> Option<cursor::PendingDevice> {
    cursor::read(w.kv.as_ref(), CloudKind::Metal)
        .unwrap()
        .unwrap_or_default()
        .pending
        .into_iter()
        .find(|p| p.device == device(n))
}

/// A sample of the exposition scraped at `now`.
async fn scraped(w: &World, now: u64, series: &str) -> Option<f64> {
    let text = w
        .spawn(now, |r| metrics::scrape(r.ctx))
        .await
        .unwrap()
        .unwrap();
    let series = series.to_string();
    text.lines().find_map(|l| {
        l.strip_prefix(series.as_str())?
            .strip_prefix(' ')?
            .parse()
            .ok()
    })
}

/// A device whose reads keep failing is read once per backoff, on the
/// clock: 60 s after its first failure, 120 s after its second; the calls
/// in between leave it alone (no read, no error, nothing more to do); a
/// device deleted behind it is told at once; the metrics show it failing
/// and how long it waits; once Metal answers, it is handled and leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_device_backs_off_on_the_clock_and_holds_no_other() {
    let w = ready().await;
    assigned(&w, 0, 20_000).await;
    assigned(&w, 1, 20_001).await;
    poll_at(&w, 20_002).await;
    // Events name device 0, then device 1 is deleted.
    w.sim.set_device_state(&device(0), "powering_off");
    w.sim.set_device_state(&device(0), "active");
    w.sim.delete_device(&device(1));
    failing(&w.sim, 0, 500);
    w.sim.clear_requests();
    let t = 20_100;
    let first = poll_at(&w, t).await;
    assert_eq!(first.device_deleted, [format!("{NS}/m-1")], "{first:?}");
    assert_eq!(first.device_failures.len(), 1, "{first:?}");
    let f = &first.device_failures[0];
    assert_eq!((f.device.as_str(), f.failures), (device(0).as_str(), 1));
    assert!(
        f.error.contains("MetalUnavailable") && f.error.contains("500"),
        "{f:?}"
    );
    // The read's budget (at most 3 s on the injected clock: this world's
    // client allows 2 s) is what it cost.
    let retry_at = f.retry_at;
    assert!(
        (t + BACKOFF_BASE_S..=t + BACKOFF_BASE_S + 4).contains(&retry_at),
        "{retry_at}"
    );
    let n = reads(&w.sim, 0);
    assert!(n >= 1, "{n} reads");
    assert_eq!((first.pending, first.more), (1, false), "{first:?}");
    // What the alert reads, from what the poll recorded.
    let seen = summary::read_poll(w.kv.as_ref()).unwrap().unwrap();
    assert_eq!((seen.failing, seen.pending), (1, 1));
    let since = pending(&w, 0).unwrap().since;
    assert!((20_002..=t).contains(&since), "{since}");
    assert_eq!(
        scraped(&w, t + 500, "metal_ipam_poll_oldest_pending_seconds").await,
        Some((t + 500 - since) as f64)
    );
    assert_eq!(
        scraped(&w, t + 500, "metal_ipam_poll_devices_failing").await,
        Some(1.0)
    );
    // Before its backoff ends: left alone, the call is clean.
    let between = poll_at(&w, retry_at - 1).await;
    assert_eq!(reads(&w.sim, 0), n, "not read while it backs off");
    assert!(between.errors.is_empty(), "{between:?}");
    assert_eq!(between.backing_off.len(), 1, "{between:?}");
    assert_eq!(between.backing_off[0].retry_at, retry_at);
    assert!(!between.more);
    // At its time: read again, fails again, waits twice as long.
    let second = poll_at(&w, retry_at).await;
    assert!(reads(&w.sim, 0) > n, "read again at {retry_at}");
    let f = &second.device_failures[0];
    assert_eq!(f.failures, 2, "{second:?}");
    assert!(
        (retry_at + 2 * BACKOFF_BASE_S..=retry_at + 2 * BACKOFF_BASE_S + 4).contains(&f.retry_at),
        "{f:?}"
    );
    // Metal answers again: handled at its next time, its claim synced.
    w.sim.clear_faults();
    let last = poll_at(&w, f.retry_at).await;
    assert_eq!(last.devices, 1, "{last:?}");
    assert_eq!(last.synced, [(format!("{NS}/m-0"), "bound")], "{last:?}");
    assert!(last.errors.is_empty() && last.device_failures.is_empty());
    assert_eq!(last.pending, 0);
    assert_eq!(pending(&w, 0), None);
    let seen = summary::read_poll(w.kv.as_ref()).unwrap().unwrap();
    assert_eq!(
        (seen.failing, seen.pending, seen.oldest_pending_since),
        (0, 0, 0)
    );
    w.assert_record_valid("metal/poll", "metal-poll-cursor.schema.json");
    w.assert_clean();
}

/// Metal failing every device read: the call stops after two failures in
/// a row with none answered (503 `MetalUnavailable` naming them), not
/// device by device through its budget; those two back off and the next
/// call reads the third; no success is recorded for the stopped call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metal_failing_every_device_read_stops_the_call_after_two() {
    let w = ready().await;
    for n in 0..3 {
        assigned(&w, n, 20_000 + n as u64).await;
    }
    poll_at(&w, 20_010).await;
    let before = summary::read_poll(w.kv.as_ref()).unwrap().unwrap().at;
    for n in 0..3 {
        w.sim.set_device_state(&device(n), "powering_off");
        failing(&w.sim, n, 503);
    }
    w.sim.clear_requests();
    let e: Error = try_poll(&w, 20_100).await.unwrap_err();
    assert_eq!((e.status(), e.reason()), (503, "MetalUnavailable"), "{e}");
    assert!(
        e.message().contains(&device(0)) && e.message().contains(&device(1)),
        "{e}"
    );
    assert_eq!(DOWN_AFTER, 2);
    assert!(reads(&w.sim, 0) > 0 && reads(&w.sim, 1) > 0);
    assert_eq!(reads(&w.sim, 2), 0, "stopped before the third device");
    assert_eq!(pending(&w, 0).unwrap().failures, 1);
    assert_eq!(pending(&w, 1).unwrap().failures, 1);
    assert_eq!(pending(&w, 2).unwrap().failures, 0);
    let seen = summary::read_poll(w.kv.as_ref()).unwrap().unwrap();
    assert_eq!(seen.at, before, "a stopped call is not a success");
    assert_eq!((seen.failing, seen.pending), (2, 3));
    // The next call leaves the two alone and reads the third: one failure
    // alone is the device's, the call goes on and answers.
    let next = poll_at(&w, 20_101).await;
    assert_eq!(next.backing_off.len(), 2, "{next:?}");
    assert_eq!(next.device_failures.len(), 1, "{next:?}");
    assert_eq!(next.device_failures[0].device, device(2));
    w.assert_clean();
}

/// A refused token on a device read is not the device's failure: the call
/// stops at once with that error (500 `MetalForbidden`, not a "retry"),
/// and nothing backs off: the device is read again by the very next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_that_is_not_the_devices_stops_the_call_and_backs_nothing_off() {
    let w = ready().await;
    assigned(&w, 0, 20_000).await;
    assigned(&w, 1, 20_001).await;
    poll_at(&w, 20_002).await;
    w.sim.set_device_state(&device(0), "powering_off");
    w.sim.set_device_state(&device(1), "powering_off");
    failing(&w.sim, 0, 403);
    w.sim.clear_requests();
    let e = try_poll(&w, 20_100).await.unwrap_err();
    assert_eq!((e.status(), e.reason()), (500, "MetalForbidden"), "{e}");
    assert_eq!(reads(&w.sim, 0), 1, "a 403 is not retried");
    assert_eq!(reads(&w.sim, 1), 0, "the call stopped");
    let p = pending(&w, 0).unwrap();
    assert_eq!((p.failures, p.retry_at), (0, 0), "{p:?}");
    w.sim.clear_faults();
    let next = poll_at(&w, 20_101).await;
    assert_eq!(next.devices, 2, "{next:?}");
    assert_eq!(next.pending, 0);
    w.assert_clean();
}
