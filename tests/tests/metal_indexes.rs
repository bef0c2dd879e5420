//! Issue 26, finding 9 (the poll's and the reconcile's part): the Metal
//! poll and the full reconcile read the claims' assignment records and the
//! devices' apply records through their indexes, never by listing the
//! store (`KEYS *` on Redis), and the indexes follow what is alive: a
//! closed assignment record leaves at the next listing. Natively, against
//! the fake Kubernetes API and the Metal simulator, the store counting its
//! operations.

use metal_ipam_core::capi::network::machines_to_sync;
use metal_ipam_core::capi::poll::poll;
use metal_ipam_core::capi::reconcile::ReconcileReport;
use metal_ipam_core::capi::{self, StepResult};
use metal_ipam_core::cloud::CloudKind;
use metal_ipam_core::kv::registry;
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::provision::assign::CLAIMS;
use metal_ipam_core::testing::Backend;
use metal_ipam_tests::fake_kube::IPAM_GROUP;
use metal_ipam_tests::vrf_world::{assigned, device, pool_object, World, NS};

/// The claims the assignment index lists.
fn listed(w: &World) -> Vec<String> {
    registry::read(w.kv.as_ref(), &CLAIMS.id)
        .unwrap()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_poll_and_the_reconcile_read_through_indexes_that_follow_what_is_alive() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = World::new(backend).await;
        w.kube.create(pool_object());
        let (o, _) = w.sync_until_settled(6).await;
        assert_eq!(o.result, StepResult::Synced, "{o:?}");
        for n in 0..3 {
            assigned(&w, n, 20_000 + n as u64).await;
        }
        // The first poll resyncs: every known device (read through the
        // indexes) is handled.
        let first = w
            .spawn(20_010, |r| {
                poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
            })
            .await
            .unwrap()
            .unwrap();
        assert!(first.resync && first.devices == 3, "{first:?}");
        // Events name every device: the poll reads their claims' records,
        // without listing the store.
        for n in 0..3 {
            w.sim.set_device_state(&device(n), "powering_off");
        }
        w.kv.reset_counts();
        let p = w
            .spawn(20_011, |r| {
                poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(p.devices, 3, "{backend:?}: {p:?}");
        assert_eq!(
            w.kv.counts().list_keys,
            0,
            "{backend:?}: the poll listed the store"
        );
        // The reconcile's readers of the same records: the Machines to
        // sync and the observation summary.
        w.kv.reset_counts();
        let summary = w
            .spawn(20_012, |r| {
                machines_to_sync(r.ctx, r.kube, std::iter::empty())?;
                ReconcileReport::default().summary(r.ctx, &[], 20_012, 0)
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(summary.assignments.get("assigned"), Some(&3), "{summary:?}");
        assert_eq!(
            w.kv.counts().list_keys,
            0,
            "{backend:?}: the reconcile listed the store"
        );
        assert_eq!(listed(&w), ["team-a/m-0", "team-a/m-1", "team-a/m-2"]);
        // Two claims go: their records close, and the next listing drops
        // them from the index, which holds what is alive.
        for n in 0..2 {
            let name = format!("m-{n}");
            w.kube
                .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), &name);
            let o = w
                .spawn(20_020 + n as u64, move |r| {
                    capi::assign::sync_claim_assignment(r.ctx, r.kube, r.metal, NS, &name)
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(o.result, StepResult::Released, "{o:?}");
        }
        let summary = w
            .spawn(20_030, |r| {
                ReconcileReport::default().summary(r.ctx, &[], 20_030, 0)
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(summary.assignments.values().sum::<u32>(), 1, "{summary:?}");
        assert_eq!(listed(&w), ["team-a/m-2"], "{backend:?}");
        w.assert_clean();
    }
}
