//! Model-based property tests of the allocator, through the real steps and
//! the key-value protocol (in-memory store with each Spin backend's quirks).
//!
//! Random pools (IPv4 and IPv6, including /64s) and random sequences of
//! allocate / release / re-create / clock moves are applied both to
//! metal-ipam and to a deliberately naive reference model; every answer,
//! every address and the pool counts must agree, and no address may ever be
//! bound to two claims.
//!
//! Scale with `PROPTEST_CASES` (default 256 per test).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use metal_ipam_core::ip::{from_u128, Family};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
use metal_ipam_core::provision::assign::MetalAssignmentClosed;
use metal_ipam_core::testing::{Backend, World};
use proptest::prelude::*;
use serde_json::json;

const NAMES: usize = 6;

#[derive(Debug, Clone)]
struct PoolGen {
    family: Family,
    base: u128,
    prefix: u8,
    /// (offset, length) inside the subnet, in the order written.
    entries: Vec<(u128, u128)>,
    excluded: Vec<(u128, u128)>,
    gateway: Option<u128>,
    reserved_too: bool,
    grace: u64,
    /// claim index → index into the first allocatable addresses.
    pre: Vec<(usize, usize)>,
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        name: usize,
        new_uid: bool,
        requested: Option<u128>,
    },
    Release {
        name: usize,
    },
    Advance(u64),
}

fn pool_gen() -> impl Strategy<Value = PoolGen> {
    let fam = prop_oneof![
        Just((Family::V4, 0x0a00_0000u128, 27u8)),
        Just((Family::V4, 0xc0a8_0100u128, 28u8)),
        Just((
            Family::V6,
            0x2001_0db8_0000_0000_0000_0000_0000_0000u128,
            120u8
        )),
        Just((
            Family::V6,
            0x2001_0db8_0001_0000_0000_0000_0000_0000u128,
            64u8
        )),
    ];
    fam.prop_flat_map(|(family, base, prefix)| {
        let size: u128 = 1u128 << (u32::from(family.bits()) - u32::from(prefix));
        let small = size.min(64);
        // For /64 pools also place a range far into the subnet.
        let far = if size > 1 << 40 { 1u128 << 40 } else { 0 };
        let entry = (0..small, 1..=small, prop::bool::ANY).prop_map(move |(o, l, far_away)| {
            let start = if far_away { far + o } else { o };
            (start, l.min(size - start))
        });
        (
            prop::collection::vec(entry, 1..4),
            prop::collection::vec((0..small, 1u128..4), 0..3),
            prop::option::of(0..small),
            prop::bool::ANY,
            prop_oneof![Just(0u64), Just(10u64)],
            prop::collection::vec((0..NAMES, 0usize..12), 0..3),
        )
            .prop_map(
                move |(entries, excluded, gateway, reserved_too, grace, pre)| PoolGen {
                    family,
                    base,
                    prefix,
                    entries,
                    excluded,
                    gateway,
                    reserved_too,
                    grace,
                    pre,
                },
            )
    })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        5 => (0..NAMES, prop::bool::weighted(0.15), prop::option::weighted(0.2, 0u128..40))
            .prop_map(|(name, new_uid, requested)| Op::Alloc { name, new_uid, requested }),
        2 => (0..NAMES).prop_map(|name| Op::Release { name }),
        1 => (1u64..8).prop_map(Op::Advance),
    ];
    prop::collection::vec(op, 1..60)
}

/// The reference model: explicit sets, linear scans, no cleverness.
struct Model {
    g: PoolGen,
    pre: BTreeMap<String, u128>,
    bound: BTreeMap<String, (String, u128)>,
    cooling: Vec<(u128, u64)>,
    now: u64,
}

impl Model {
    fn subnet(&self) -> (u128, u128) {
        let size = 1u128 << (u32::from(self.g.family.bits()) - u32::from(self.g.prefix));
        (self.g.base, self.g.base + (size - 1))
    }

    fn configured(&self, a: u128) -> bool {
        self.g
            .entries
            .iter()
            .any(|&(o, l)| a >= self.g.base + o && a < self.g.base + o + l)
    }

    fn allowed(&self, a: u128) -> bool {
        if !self.configured(a) {
            return false;
        }
        if self
            .g
            .excluded
            .iter()
            .any(|&(o, l)| a >= self.g.base + o && a < self.g.base + o + l)
        {
            return false;
        }
        if !self.g.reserved_too {
            let (net, last) = self.subnet();
            let edges = match self.g.family {
                Family::V4 => self.g.prefix < 31,
                Family::V6 => self.g.prefix < 127,
            };
            if edges && (a == net || (self.g.family == Family::V4 && a == last)) {
                return false;
            }
            if self.g.gateway.map(|o| self.g.base + o) == Some(a) {
                return false;
            }
        }
        true
    }

    /// The configured ranges, sorted and merged (the model's own sweep,
    /// independent of `ip::RangeSet`).
    fn merged(&self) -> Vec<(u128, u128)> {
        let mut starts: Vec<(u128, u128)> = self
            .g
            .entries
            .iter()
            .map(|&(o, l)| (self.g.base + o, self.g.base + o + l - 1))
            .collect();
        starts.sort();
        let mut merged: Vec<(u128, u128)> = Vec::new();
        for (a, b) in starts {
            match merged.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        merged
    }

    /// Allocatable addresses in ascending order (lazily, so /64 pools work).
    fn allocatable(&self) -> impl Iterator<Item = u128> + '_ {
        let merged = self.merged();
        merged
            .into_iter()
            .flat_map(|(a, b)| a..=b)
            .filter(move |&a| self.allowed(a))
    }

    fn total(&self) -> u128 {
        // Configured size minus the few disallowed points inside it.
        let merged = self.merged();
        let size: u128 = merged.iter().map(|(a, b)| b - a + 1).sum();
        let mut bad = BTreeSet::new();
        for &(o, l) in &self.g.excluded {
            for a in self.g.base + o..self.g.base + o + l {
                bad.insert(a);
            }
        }
        let (net, last) = self.subnet();
        bad.insert(net);
        bad.insert(last);
        if let Some(o) = self.g.gateway {
            bad.insert(self.g.base + o);
        }
        let disallowed = bad
            .iter()
            .filter(|&&a| self.configured(a) && !self.allowed(a))
            .count() as u128;
        size - disallowed
    }

    fn taken(&self, a: u128) -> bool {
        self.bound.values().any(|(_, b)| *b == a) || self.cooling.iter().any(|(c, _)| *c == a)
    }

    fn expire(&mut self) {
        let now = self.now;
        self.cooling.retain(|(_, until)| *until > now);
    }

    /// Expected outcome of an allocation: Ok((address, created)) or Err(reason).
    fn alloc(
        &mut self,
        name: &str,
        uid: &str,
        requested: Option<u128>,
    ) -> Result<(u128, bool), &'static str> {
        if let Some((buid, a)) = self.bound.get(name) {
            return if buid == uid {
                Ok((*a, false))
            } else {
                Err("ClaimUidConflict")
            };
        }
        self.expire();
        let reserved: BTreeSet<u128> = self
            .pre
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, a)| *a)
            .collect();
        let address = if let Some(&p) = self.pre.get(name) {
            if requested.is_some_and(|r| r != p) {
                return Err("PreAllocationMismatch");
            }
            if self.bound.values().any(|(_, b)| *b == p) {
                return Err("AddressInUse");
            }
            self.cooling.retain(|(c, _)| *c != p);
            p
        } else if let Some(r) = requested {
            if !self.allowed(r) {
                return Err("AddressNotInPool");
            }
            if reserved.contains(&r) {
                return Err("AddressReserved");
            }
            if self.taken(r) {
                return Err("AddressInUse");
            }
            r
        } else {
            match self
                .allocatable()
                .find(|a| !self.taken(*a) && !reserved.contains(a))
            {
                Some(a) => a,
                None => return Err("PoolExhausted"),
            }
        };
        self.bound
            .insert(name.to_string(), (uid.to_string(), address));
        Ok((address, true))
    }

    fn release(&mut self, name: &str) {
        if let Some((_, a)) = self.bound.remove(name) {
            if self.g.grace > 0 {
                self.cooling.push((a, self.now + self.g.grace));
            }
        }
    }
}

fn spec_json(g: &PoolGen, pre: &BTreeMap<String, u128>) -> serde_json::Value {
    let ip = |o: u128| from_u128(g.family, g.base + o).to_string();
    let entry = |&(o, l): &(u128, u128)| {
        if l == 1 {
            ip(o)
        } else {
            format!("{}-{}", ip(o), ip(o + l - 1))
        }
    };
    let mut spec = json!({
        "addresses": g.entries.iter().map(entry).collect::<Vec<_>>(),
        "prefix": g.prefix,
        "excludedAddresses": g.excluded.iter().map(entry).collect::<Vec<_>>(),
        "allocateReservedIPAddresses": g.reserved_too,
        "addressReuseGracePeriodSeconds": g.grace,
    });
    if let Some(o) = g.gateway {
        spec["gateway"] = ip(o).into();
    }
    if !pre.is_empty() {
        spec["preAllocations"] = pre
            .iter()
            .map(|(n, a)| (n.clone(), json!(from_u128(g.family, *a).to_string())))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    spec
}

fn claim(name: &str, uid: &str, requested: Option<IpAddr>) -> Claim {
    let mut j = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}
    });
    if let Some(r) = requested {
        j["metadata"]["annotations"] =
            json!({"ipam.metal-ipam.dev/requested-address": r.to_string()});
    }
    Claim::parse(&j).unwrap()
}

fn run(g: PoolGen, ops: Vec<Op>, backend: Backend) -> Result<(), TestCaseError> {
    let mut model = Model {
        g: g.clone(),
        pre: BTreeMap::new(),
        bound: BTreeMap::new(),
        cooling: Vec::new(),
        now: 1_000,
    };
    let first: Vec<u128> = model.allocatable().take(12).collect();
    let mut pre = BTreeMap::new();
    let mut used_pre = BTreeSet::new();
    for &(n, i) in &g.pre {
        if let Some(&a) = first.get(i) {
            if used_pre.insert(a) {
                pre.entry(format!("c{n}")).or_insert(a);
            }
        }
    }
    model.pre = pre.clone();
    let w = World::new(backend, model.now);
    let ctx = w.ctx();
    let id = PoolId::namespaced("ns", "p");
    let obj = PoolObject::parse(
        &id,
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": spec_json(&g, &pre)}),
    )
    .unwrap();
    ops::put_pool(&ctx, obj).map_err(|e| TestCaseError::fail(format!("put_pool: {e}")))?;

    let mut uids: Vec<u32> = vec![0; NAMES];
    for op in ops {
        match op {
            Op::Alloc {
                name,
                new_uid,
                requested,
            } => {
                if new_uid {
                    uids[name] += 1;
                }
                let n = format!("c{name}");
                let uid = format!("uid-{name}-{}", uids[name]);
                let req = requested.map(|o| g.base + o);
                let want = model.alloc(&n, &uid, req);
                let got =
                    ops::allocate(&ctx, &claim(&n, &uid, req.map(|r| from_u128(g.family, r))));
                match (want, got) {
                    (Ok((a, created)), Ok(got)) => {
                        prop_assert_eq!(
                            got.record.address.clone(),
                            from_u128(g.family, a).to_string()
                        );
                        prop_assert_eq!(got.created, created);
                    }
                    (Err(reason), Err(e)) => prop_assert_eq!(e.reason(), reason),
                    (w, g) => prop_assert!(
                        false,
                        "model {:?} vs got {:?}",
                        w,
                        g.map(|a| a.record.address)
                    ),
                }
            }
            Op::Release { name } => {
                let n = format!("c{name}");
                model.release(&n);
                ops::release(&ctx, "ns", &n, None, &MetalAssignmentClosed)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                // A release always leaves the claim unbound and is followed
                // by a new incarnation.
                uids[name] += 1;
            }
            Op::Advance(s) => {
                model.now += s;
                w.env.set_now(model.now);
            }
        }
        // Invariants after every step.
        let mut seen = BTreeSet::new();
        for i in 0..NAMES {
            let n = format!("c{i}");
            let rec =
                ops::get_claim(&w.kv, "ns", &n).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = model
                .bound
                .get(&n)
                .map(|(_, a)| from_u128(g.family, *a).to_string());
            prop_assert_eq!(rec.as_ref().map(|r| r.address.clone()), want.clone());
            if let Some(a) = want {
                prop_assert!(seen.insert(a), "address bound twice");
            }
        }
        model.expire();
        let view = ops::get_pool(&w.kv, &id, 0).unwrap().unwrap();
        let bound = model.bound.len() as u128;
        prop_assert_eq!(view.counts.used, bound);
        prop_assert_eq!(view.counts.out_of_range, 0);
        let total = model.total();
        prop_assert_eq!(view.counts.total, total);
        // Cooling entries are pruned lazily by the next write, so the free
        // count may lag behind the clock by the expired ones; recount.
        let cooling_live = view.counts.total - view.counts.used - view.counts.free;
        prop_assert!(cooling_live >= model.cooling.len() as u128);
    }
    prop_assert_eq!(w.kv.increment_panics(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256), ..ProptestConfig::default() })]

    #[test]
    fn allocator_matches_model_on_spin_sqlite(g in pool_gen(), ops in ops()) {
        run(g, ops, Backend::SpinSqlite)?;
    }

    #[test]
    fn allocator_matches_model_on_redis(g in pool_gen(), ops in ops()) {
        run(g, ops, Backend::Redis)?;
    }
}
