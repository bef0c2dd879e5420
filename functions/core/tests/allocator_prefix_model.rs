//! Model-based property tests of prefix pools (`MetalPrefixPool`), through
//! the real steps and the key-value protocol (in-memory store with each
//! Spin backend's quirks).
//!
//! The reference model knows nothing of the allocator's units: it holds
//! each bound sub-prefix as an **interval of addresses** and decides by
//! overlap. A candidate is an aligned block of the allocation length
//! inside one of the pool's prefixes that overlaps no excluded range, no
//! bound or cooling interval and no other claim's pre-allocation; the
//! lowest wins. After every step no two bound intervals may overlap, and
//! every binding, answer and count must agree with the model.
//!
//! Random pools are IPv4 (/24–/28 handing out /28–/30) and IPv6 (/56 of
//! /64s, /120 of /124s, and a /48 of /64s with prefixes far apart).
//! Scale with `PROPTEST_CASES` (default 256 per test).

use std::collections::{BTreeMap, BTreeSet};

use metal_ipam_core::ip::{from_u128, Family};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolKind, PoolObject};
use metal_ipam_core::provision::assign::MetalAssignmentClosed;
use metal_ipam_core::testing::{Backend, World};
use proptest::prelude::*;
use serde_json::json;

const NAMES: usize = 6;

#[derive(Debug, Clone)]
struct PoolGen {
    family: Family,
    base: u128,
    /// Length of the area the prefixes are drawn from.
    area: u8,
    /// `allocationPrefixLength`.
    len: u8,
    /// (offset in sub-prefixes, length) of each `prefixes` entry; the
    /// offset is aligned to the entry's length when written.
    prefixes: Vec<(u128, u8)>,
    /// (first address offset, address count) of each excluded range.
    excluded: Vec<(u128, u128)>,
    gateway: Option<u128>,
    grace: u64,
    /// claim index → index into the first allocatable sub-prefixes.
    pre: Vec<(usize, usize)>,
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        name: usize,
        new_uid: bool,
        /// A sub-prefix index in the area, and whether to ask for an
        /// address inside it that is not its network address.
        requested: Option<(u128, bool)>,
    },
    Release {
        name: usize,
    },
    Advance(u64),
}

fn pool_gen() -> impl Strategy<Value = PoolGen> {
    let shape = prop_oneof![
        Just((Family::V4, 0x0a14_0000u128, 24u8, 28u8)),
        Just((Family::V4, 0x0a14_0000u128, 26u8, 29u8)),
        Just((Family::V4, 0xc0a8_0000u128, 27u8, 30u8)),
        Just((
            Family::V6,
            0x2001_0db8_0000_0100_0000_0000_0000_0000u128,
            56u8,
            64u8
        )),
        Just((
            Family::V6,
            0x2001_0db8_0000_0000_0000_0000_0000_0000u128,
            120u8,
            124u8
        )),
        Just((
            Family::V6,
            0xfd00_0000_0000_0000_0000_0000_0000_0000u128,
            48u8,
            64u8
        )),
    ];
    shape.prop_flat_map(|(family, base, area, len)| {
        let subs: u128 = 1u128 << (len - area);
        let unit: u128 = 1u128 << (u32::from(family.bits()) - u32::from(len));
        // Entries between the area's length and the allocation length,
        // at most 2^6 sub-prefixes each.
        let entry_len = (area.max(len.saturating_sub(6)))..=len;
        let entry = (0..subs, entry_len);
        let excluded = (0..subs.min(64), 0..unit.max(2), 1..=unit.saturating_mul(2))
            .prop_map(move |(s, inner, n)| (s * unit + inner % unit, n));
        (
            prop::collection::vec(entry, 1..4),
            prop::collection::vec(excluded, 0..3),
            prop::option::of(0..subs.min(64) * unit),
            prop_oneof![Just(0u64), Just(10u64)],
            prop::collection::vec((0..NAMES, 0usize..8), 0..3),
        )
            .prop_map(move |(prefixes, excluded, gateway, grace, pre)| PoolGen {
                family,
                base,
                area,
                len,
                prefixes,
                excluded,
                gateway,
                grace,
                pre,
            })
    })
}

fn ops(subs: u128) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        5 => (0..NAMES, prop::bool::weighted(0.15),
              prop::option::weighted(0.2, (0..subs.min(80), prop::bool::weighted(0.2))))
            .prop_map(|(name, new_uid, requested)| Op::Alloc { name, new_uid, requested }),
        2 => (0..NAMES).prop_map(|name| Op::Release { name }),
        1 => (1u64..8).prop_map(Op::Advance),
    ];
    prop::collection::vec(op, 1..50)
}

/// The reference model: address intervals and linear scans.
struct Model {
    g: PoolGen,
    pre: BTreeMap<String, u128>,
    /// claim → (uid, first address of its sub-prefix)
    bound: BTreeMap<String, (String, u128)>,
    cooling: Vec<(u128, u64)>,
    now: u64,
}

impl Model {
    /// Addresses in one sub-prefix.
    fn unit(&self) -> u128 {
        1u128 << (u32::from(self.g.family.bits()) - u32::from(self.g.len))
    }

    /// The `prefixes` entries as address intervals (aligned as written).
    fn prefixes(&self) -> Vec<(u128, u128)> {
        self.g
            .prefixes
            .iter()
            .map(|&(off, l)| {
                let size = 1u128 << (u32::from(self.g.family.bits()) - u32::from(l));
                let start = self.g.base + (off * self.unit()) / size * size;
                (start, start + size - 1)
            })
            .collect()
    }

    fn overlaps(a: (u128, u128), b: (u128, u128)) -> bool {
        a.0 <= b.1 && b.0 <= a.1
    }

    fn interval(&self, start: u128) -> (u128, u128) {
        (start, start + self.unit() - 1)
    }

    /// Whether the aligned sub-prefix at `start` may be handed out at all.
    fn allowed(&self, start: u128) -> bool {
        let iv = self.interval(start);
        start.is_multiple_of(self.unit())
            && self.prefixes().iter().any(|&(a, b)| a <= iv.0 && iv.1 <= b)
            && !self
                .g
                .excluded
                .iter()
                .any(|&(o, n)| Self::overlaps(iv, (self.g.base + o, self.g.base + o + n - 1)))
    }

    /// Allowed sub-prefixes, ascending.
    fn allocatable(&self) -> Vec<u128> {
        let mut starts = BTreeSet::new();
        for (a, b) in self.prefixes() {
            let mut s = a;
            while s <= b {
                starts.insert(s);
                s += self.unit();
            }
        }
        starts.into_iter().filter(|&s| self.allowed(s)).collect()
    }

    fn taken(&self, start: u128) -> bool {
        let iv = self.interval(start);
        self.bound
            .values()
            .any(|(_, b)| Self::overlaps(iv, self.interval(*b)))
            || self
                .cooling
                .iter()
                .any(|(c, _)| Self::overlaps(iv, self.interval(*c)))
    }

    fn expire(&mut self) {
        let now = self.now;
        self.cooling.retain(|(_, until)| *until > now);
    }

    fn alloc(
        &mut self,
        name: &str,
        uid: &str,
        requested: Option<u128>,
        all: &[u128],
    ) -> Result<(u128, bool), &'static str> {
        if let Some((buid, a)) = self.bound.get(name) {
            return if buid == uid {
                Ok((*a, false))
            } else {
                Err("ClaimUidConflict")
            };
        }
        // An address that is not a sub-prefix's network address is refused
        // before anything else (as an address of another family is).
        if requested.is_some_and(|r| !r.is_multiple_of(self.unit())) {
            return Err("AddressNotInPool");
        }
        self.expire();
        let reserved: Vec<u128> = self
            .pre
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, a)| *a)
            .collect();
        let reserved_hit = |s: u128| {
            reserved
                .iter()
                .any(|r| Self::overlaps(self.interval(s), self.interval(*r)))
        };
        let start = if let Some(&p) = self.pre.get(name) {
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
            if reserved_hit(r) {
                return Err("AddressReserved");
            }
            if self.taken(r) {
                return Err("AddressInUse");
            }
            r
        } else {
            match all
                .iter()
                .copied()
                .find(|&s| !self.taken(s) && !reserved_hit(s))
            {
                Some(s) => s,
                None => return Err("PoolExhausted"),
            }
        };
        self.bound
            .insert(name.to_string(), (uid.to_string(), start));
        Ok((start, true))
    }

    fn release(&mut self, name: &str) {
        if let Some((_, a)) = self.bound.remove(name) {
            if self.g.grace > 0 {
                self.cooling.push((a, self.now + self.g.grace));
            }
        }
    }
}

fn spec_json(m: &Model) -> serde_json::Value {
    let g = &m.g;
    let ip = |v: u128| from_u128(g.family, v).to_string();
    let prefixes: Vec<String> = m
        .prefixes()
        .iter()
        .zip(&g.prefixes)
        .map(|(&(a, _), &(_, l))| format!("{}/{l}", ip(a)))
        .collect();
    let excluded: Vec<String> = g
        .excluded
        .iter()
        .map(|&(o, n)| {
            if n == 1 {
                ip(g.base + o)
            } else {
                format!("{}-{}", ip(g.base + o), ip(g.base + o + n - 1))
            }
        })
        .collect();
    let mut spec = json!({
        "prefixes": prefixes,
        "allocationPrefixLength": g.len,
        "excludedPrefixes": excluded,
        "addressReuseGracePeriodSeconds": g.grace,
    });
    if let Some(o) = g.gateway {
        spec["gateway"] = ip(g.base + o).into();
    }
    if !m.pre.is_empty() {
        spec["preAllocations"] = m
            .pre
            .iter()
            .map(|(n, a)| (n.clone(), json!(format!("{}/{}", ip(*a), g.len))))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    spec
}

fn claim(name: &str, uid: &str, requested: Option<String>) -> Claim {
    let mut j = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalPrefixPool", "name": "p"}}
    });
    if let Some(r) = requested {
        j["metadata"]["annotations"] = json!({"ipam.metal-ipam.dev/requested-address": r});
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
    let all = model.allocatable();
    let mut used_pre = BTreeSet::new();
    for &(n, i) in &g.pre {
        if let Some(&a) = all.get(i) {
            if used_pre.insert(a) {
                model.pre.entry(format!("c{n}")).or_insert(a);
            }
        }
    }
    let w = World::new(backend, model.now);
    let ctx = w.ctx();
    let id = PoolId::of(PoolKind::NamespacedPrefix, "ns", "p");
    let obj = PoolObject::parse(
        &id,
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": spec_json(&model)}),
    )
    .map_err(|e| TestCaseError::fail(format!("parse: {e}")))?;
    ops::put_pool(&ctx, obj).map_err(|e| TestCaseError::fail(format!("put_pool: {e}")))?;
    let view = ops::get_pool(&w.kv, &id, 0).unwrap().unwrap();
    prop_assert_eq!(view.counts.total, all.len() as u128);

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
                // A sub-prefix of the area; `inside`: an address within it
                // that is not its network address (never a sub-prefix).
                let req = requested.map(|(i, inside)| {
                    g.base + i * model.unit() + u128::from(inside && model.unit() > 1)
                });
                let want = model.alloc(&n, &uid, req, &all);
                let text = req.map(|r| from_u128(g.family, r).to_string());
                let got = ops::allocate(&ctx, &claim(&n, &uid, text));
                match (want, got) {
                    (Ok((a, created)), Ok(got)) => {
                        prop_assert_eq!(
                            got.record.address.clone(),
                            from_u128(g.family, a).to_string()
                        );
                        prop_assert_eq!(got.record.prefix, g.len);
                        prop_assert_eq!(got.created, created);
                    }
                    (Err(reason), Err(e)) => prop_assert_eq!(e.reason(), reason),
                    (w, got) => prop_assert!(
                        false,
                        "model {:?} vs got {:?}",
                        w,
                        got.map(|a| a.record.address)
                    ),
                }
            }
            Op::Release { name } => {
                let n = format!("c{name}");
                model.release(&n);
                ops::release(&ctx, "ns", &n, None, &MetalAssignmentClosed)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                uids[name] += 1;
            }
            Op::Advance(s) => {
                model.now += s;
                w.env.set_now(model.now);
            }
        }
        // After every step: the store's bindings are the model's, and no
        // two bound sub-prefixes overlap (as address intervals).
        let mut held: Vec<(u128, u128)> = Vec::new();
        for i in 0..NAMES {
            let n = format!("c{i}");
            let rec =
                ops::get_claim(&w.kv, "ns", &n).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = model
                .bound
                .get(&n)
                .map(|(_, a)| from_u128(g.family, *a).to_string());
            prop_assert_eq!(rec.as_ref().map(|r| r.address.clone()), want);
            if let Some(r) = rec {
                let a = metal_ipam_core::ip::to_u128(r.address.parse().unwrap());
                let iv = (
                    a,
                    a + (1u128 << (u32::from(g.family.bits()) - u32::from(r.prefix))) - 1,
                );
                prop_assert!(
                    held.iter().all(|h| !Model::overlaps(*h, iv)),
                    "{} overlaps another bound sub-prefix",
                    r.address
                );
                held.push(iv);
            }
        }
        model.expire();
        let view = ops::get_pool(&w.kv, &id, 0).unwrap().unwrap();
        prop_assert_eq!(view.counts.used, model.bound.len() as u128);
        prop_assert_eq!(view.counts.out_of_range, 0);
        prop_assert_eq!(view.counts.total, all.len() as u128);
        let cooling_live = view.counts.total - view.counts.used - view.counts.free;
        prop_assert!(cooling_live >= model.cooling.len() as u128);
    }
    prop_assert_eq!(w.kv.increment_panics(), 0);
    Ok(())
}

fn case() -> impl Strategy<Value = (PoolGen, Vec<Op>)> {
    pool_gen().prop_flat_map(|g| {
        let subs = 1u128 << (g.len - g.area);
        (Just(g), ops(subs))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256), ..ProptestConfig::default() })]

    #[test]
    fn prefix_allocator_matches_interval_model_on_spin_sqlite((g, ops) in case()) {
        run(g, ops, Backend::SpinSqlite)?;
    }

    #[test]
    fn prefix_allocator_matches_interval_model_on_redis((g, ops) in case()) {
        run(g, ops, Backend::Redis)?;
    }
}

/// A /32 of /64s is 2³² sub-prefixes: allocation stays cheap (the pool
/// record holds ranges, not sub-prefixes) and hands out the lowest free.
#[test]
fn a_slash_32_of_slash_64s_allocates_without_enumerating() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let ctx = w.ctx();
    let id = PoolId::of(PoolKind::NamespacedPrefix, "ns", "p");
    let obj = PoolObject::parse(
        &id,
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"prefixes": ["2001:db8::/32"], "excludedPrefixes": ["2001:db8::/63"]}}),
    )
    .unwrap();
    ops::put_pool(&ctx, obj).unwrap();
    let view = ops::get_pool(&w.kv, &id, 0).unwrap().unwrap();
    assert_eq!(view.counts.total, (1u128 << 32) - 2);
    for (i, want) in ["2001:db8:0:2::", "2001:db8:0:3::", "2001:db8:0:4::"]
        .iter()
        .enumerate()
    {
        let got = ops::allocate(&ctx, &claim(&format!("c{i}"), "u", None)).unwrap();
        assert_eq!(
            (got.record.address.as_str(), got.record.prefix),
            (*want, 64)
        );
    }
    let view = ops::get_pool(&w.kv, &id, 0).unwrap().unwrap();
    assert_eq!(view.counts.used, 3);
    // The record stores one range for the three, not three entries.
    let raw = w.kv.dump();
    let record = String::from_utf8_lossy(&raw["pool/prefix-ns/ns/p"]).to_string();
    assert!(
        record.contains("\"used\":[\"2001:db8:0:2::-2001:db8:0:4::\"]"),
        "{record}"
    );
}
