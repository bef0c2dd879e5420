//! The plain pool handler on the reconcile kit: register the spec (adopting
//! the pool's `IPAddress` objects when the store does not know it), keep
//! our finalizer while addresses are allocated, write the status counts.
//! VRF-backed pools are [`crate::capi::vrf`]'s.
//!
//! Order: [`Order::DeletionFirst`] — a deleted pool is removed from the
//! store even while paused (nothing is allocated from a deleting pool).

use serde_json::{Map, Value};

use super::objects::{paused, PoolResource};
use super::{adoptions_for, write_in_cluster_pool_status, write_pool_status};
use crate::error::{Known, Result};
use crate::ipam::ops;
use crate::ipam::pool::{PoolId, PoolObject};
use crate::kube::conditions::Ready;
use crate::kube::object::WithJson;
use crate::kube::{Kube, Resource};
use crate::kv::Ctx;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::reconcile::{
    self, Cleanup, Condition, Handler, Order, Reason, Reconciled, StepResult, Verdict,
};

/// One pool's reconciliation.
pub struct PoolHandler<'c, 'k, 'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store and environment.
    pub ctx: &'c Ctx<'c, K>,
    /// The API server.
    pub kube: &'k Kube<'a, H>,
    /// The pool.
    pub id: &'c PoolId,
}

impl<K: KvStore, H: HttpClient + ?Sized> Handler<H> for PoolHandler<'_, '_, '_, K, H> {
    type Object = WithJson<PoolResource>;
    /// The spec is parsed in [`Handler::apply`]: a deleting pool is
    /// removed whatever its spec says.
    type Parsed = ();
    /// `status` fields written beside the condition.
    type Status = Map<String, Value>;
    const ORDER: Order = Order::DeletionFirst;
    const NOUN: &'static str = "pool";
    const CLEANUP_NEEDS_FINALIZER: bool = false;

    fn kube(&self) -> &Kube<'_, H> {
        self.kube
    }
    fn resource(&self) -> &'static Resource {
        self.id.kind.resource()
    }
    fn finalizer(&self) -> Option<&'static str> {
        Some(super::takeover::Finalizers::of(self.id.kind).pool)
    }

    fn read(&mut self, _first: bool) -> Result<Option<Self::Object>> {
        let id = self.id;
        Ok(self
            .kube
            .get_as(id.kind.resource(), id.namespace.as_deref(), &id.name)?)
    }

    fn gone(&mut self) -> Result<Reconciled> {
        let id = self.id.display();
        Ok(match ops::delete_pool(self.ctx, self.id) {
            Ok(true) => Reconciled::new(StepResult::Deleted, format!("pool {id} no longer exists")),
            Ok(false) => Reconciled::new(StepResult::Absent, format!("pool {id} does not exist")),
            Err(e) if e.is(Known::PoolInUse) => Reconciled::new(
                StepResult::Kept,
                format!(
                    "pool {id} was removed from Kubernetes while addresses are allocated; kept in the store: {}",
                    e.message()
                ),
            ),
            Err(e) => return Err(e),
        })
    }

    fn parse(&mut self, o: &Self::Object) -> Result<Result<(), Verdict<Self::Status>>> {
        let kind = self.id.kind;
        // The in-cluster provider's pools only while taken over (the
        // takeover's own import included) and fenced: nothing is written
        // before this.
        if !super::takeover::serves(self.ctx, self.kube, kind, true)? {
            return Ok(Err(Verdict::answer(super::takeover::not_served(
                kind, "pool",
            ))));
        }
        // Registered, synced and deleted by the provision step, after its
        // Metal resources (capi::vrf).
        Ok(if o.typed.vrf_backed {
            Err(Verdict::just(
                StepResult::Ignored,
                format!(
                    "pool {} is VRF-backed: the provision step syncs it",
                    self.id.display()
                ),
            ))
        } else {
            Ok(())
        })
    }

    fn paused(&mut self, o: &Self::Object, _: &mut ()) -> Result<Option<Reconciled>> {
        Ok(paused(o).then(|| {
            Reconciled::new(
                StepResult::Paused,
                format!("pool {} is paused", self.id.display()),
            )
        }))
    }

    fn cleanup(&mut self, _o: &Self::Object, _: &()) -> Result<Cleanup<Self::Status>> {
        match ops::delete_pool(self.ctx, self.id) {
            Ok(_) => Ok(Cleanup::Done(Reconciled::new(
                StepResult::Deleted,
                format!("pool {} deleted", self.id.display()),
            ))),
            Err(e) if e.is(Known::PoolInUse) => Ok(Cleanup::Pending(Verdict::not_ready(
                Reason::PoolInUse,
                e.message(),
                Map::new(),
            ))),
            Err(e) => Err(e),
        }
    }

    fn apply(&mut self, o: &Self::Object, _: ()) -> Result<Verdict<Self::Status>> {
        let (ctx, id) = (self.ctx, self.id);
        let object = match PoolObject::parse(id, &o.json) {
            Ok(p) => p,
            Err(e) => {
                return Ok(Verdict::not_ready(
                    Reason::InvalidSpec,
                    e.to_string(),
                    Map::new(),
                ))
            }
        };
        // A pool the store does not know (or whose record does not load:
        // the registration rebuilds it) takes its `IPAddress`es over.
        let adoptions = if !matches!(ops::find_pool(ctx.kv, id)?, ops::Found::Live(_)) {
            adoptions_for(self.kube, id)?
        } else {
            Vec::new()
        };
        match ops::put_pool_with(ctx, object, &adoptions) {
            Ok((_, view)) => {
                let counts = view.to_json()["status"]["ipAddresses"].clone();
                let fields = Map::from_iter([("ipAddresses".to_string(), counts)]);
                let message = format!(
                    "pool {} registered ({} adopted)",
                    id.display(),
                    adoptions.len()
                );
                let out = Reconciled::new(StepResult::Synced, message);
                Ok(Verdict::ready(Reason::PoolReady, fields, out))
            }
            Err(e) if reconcile::is_verdict(e.kind()) && e.kind() != crate::ErrorKind::NotFound => {
                let out = Reconciled::new(StepResult::Failed, e.to_string());
                Ok(
                    Verdict::not_ready(Reason::Other(e.reason()), e.message(), Map::new())
                        .map_outcome(|_| out),
                )
            }
            Err(e) => Err(e),
        }
    }

    fn write_status(&mut self, o: &Self::Object, c: &Condition, s: &Self::Status) -> Result<bool> {
        let ready = Ready {
            status: c.ok,
            reason: c.reason.as_str(),
            message: &c.message,
            now: self.ctx.env.now(),
        };
        let fields = (!s.is_empty()).then(|| s.clone());
        if self.id.kind.is_in_cluster() {
            // The in-cluster schema has no conditions: only the counts.
            return write_in_cluster_pool_status(self.kube, self.resource(), &o.typed, fields);
        }
        write_pool_status(self.kube, self.resource(), &o.typed, fields, ready)
    }
}
