//! Shared helpers for metal-ipam's component, concurrency and schema tests.

pub mod client;
pub mod clusterctl;
pub mod fake_kube;
pub mod fuzz;
pub mod harness;
pub mod in_cluster;
pub mod kube;
pub mod metal_sim;
pub mod oci_registry;
pub mod pnap_sim;
pub mod pnap_world;
pub mod real_kube;
pub mod real_spin;
pub mod schema;
pub mod soak;
pub mod vrf_world;

/// Declares each listed test — an `async fn name(x: T)` of the calling
/// module — on real Spin against the real API server: in module
/// `real_kube`, submodules `spin_sqlite` and `spin_redis` (so CI's
/// `spin_sqlite::` / `spin_redis::` filters run them under each Spin
/// release), a `#[tokio::test]` that gets its `x` from
/// `setup(runtime).await` (an `Option<T>`: `None` when `SPIN_BIN` or
/// `KUBEBUILDER_ASSETS` was not given, and the test returns at once).
/// The companion of [`on_every_runtime!`], whose `host`, `spin_sqlite`
/// and `spin_redis` modules the same tests may use with another setup.
///
/// ```text
/// async fn on_real(runtime: Runtime) -> Option<World> { World::on_real_kube(runtime).await }
/// metal_ipam_tests::on_real_kube!(on_real: pools_answer);
/// ```
#[macro_export]
macro_rules! on_real_kube {
    ($setup:ident: $($name:ident),+ $(,)?) => {
        mod real_kube {
            $crate::on_real_kube!(@one spin_sqlite, SpinSqlite, $setup: $($name),+);
            $crate::on_real_kube!(@one spin_redis, SpinRedis, $setup: $($name),+);
        }
    };
    (@one $module:ident, $runtime:ident, $setup:ident: $($name:ident),+) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(x) = super::super::$setup($crate::harness::Runtime::$runtime).await {
                        super::super::$name(x).await;
                    }
                }
            )+
        }
    };
}
