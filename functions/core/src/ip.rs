//! Address arithmetic: IP addresses as integers and sets of inclusive ranges.
//!
//! Pools are stored and computed as [`RangeSet`]s of `u128` (IPv4 addresses
//! occupy the low 32 bits), so a /64 pool is one range, not 2^64 entries. All
//! operations cost O(number of ranges), never O(number of addresses).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The IP family of a pool or an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Family {
    /// IPv4 (32-bit addresses).
    V4,
    /// IPv6 (128-bit addresses).
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Address width in bits: 32 or 128.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The largest address value of the family.
    pub fn max_value(self) -> u128 {
        match self {
            Family::V4 => u32::MAX as u128,
            Family::V6 => u128::MAX,
        }
    }
}

/// `ip` as an integer (IPv4 in the low 32 bits).
///
/// # Examples
/// ```
/// use metal_ipam_core::ip::{to_u128, from_u128, Family};
/// let ip = "10.0.0.1".parse().unwrap();
/// assert_eq!(to_u128(ip), 0x0a00_0001);
/// assert_eq!(from_u128(Family::V4, 0x0a00_0001), ip);
/// ```
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of `family` whose integer value is `v` (truncated to 32 bits
/// for IPv4).
pub fn from_u128(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// The first and last address of the prefix of length `prefix` containing
/// `v` (its network and broadcast/last address).
///
/// # Examples
/// ```
/// use metal_ipam_core::ip::{subnet_bounds, Family};
/// assert_eq!(subnet_bounds(Family::V4, 0x0a00_0105, 24), (0x0a00_0100, 0x0a00_01ff));
/// assert_eq!(subnet_bounds(Family::V4, 7, 32), (7, 7));
/// assert_eq!(subnet_bounds(Family::V6, 5, 0), (0, u128::MAX));
/// ```
pub fn subnet_bounds(family: Family, v: u128, prefix: u8) -> (u128, u128) {
    let bits = u32::from(family.bits());
    let host_bits = bits - u32::from(prefix.min(family.bits()));
    let host_mask: u128 = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    let start = v & !host_mask & family.max_value();
    (start, start | host_mask)
}

/// A set of integers kept as sorted, disjoint, non-adjacent inclusive ranges.
///
/// # Examples
/// ```
/// use metal_ipam_core::ip::RangeSet;
/// let mut s = RangeSet::new();
/// s.insert_range(10, 19);
/// s.insert_range(20, 25); // adjacent: merged
/// s.remove(15);
/// assert_eq!(s.ranges(), &[(10, 14), (16, 25)]);
/// assert_eq!(s.len(), 15);
/// assert!(s.contains(16) && !s.contains(15));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u128, u128)>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> Self {
        RangeSet { ranges: Vec::new() }
    }

    /// A set holding every `(start, end)` range given (any order, may
    /// overlap). Ranges with `start > end` are ignored. Sorts and sweeps:
    /// O(n log n) whatever the order (inserting the ranges one by one
    /// would shift the list for each, O(n²)).
    pub fn from_ranges<I: IntoIterator<Item = (u128, u128)>>(ranges: I) -> Self {
        let mut ranges: Vec<(u128, u128)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match out.last_mut() {
                // Overlapping or touching ranges merge.
                Some(prev) if a <= prev.1.saturating_add(1) => prev.1 = prev.1.max(b),
                _ => out.push((a, b)),
            }
        }
        RangeSet { ranges: out }
    }

    /// The normalised ranges, ascending.
    pub fn ranges(&self) -> &[(u128, u128)] {
        &self.ranges
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of elements, saturating at `u128::MAX`.
    pub fn len(&self) -> u128 {
        self.ranges.iter().fold(0u128, |acc, &(a, b)| {
            acc.saturating_add((b - a).saturating_add(1))
        })
    }

    /// Smallest element.
    pub fn first(&self) -> Option<u128> {
        self.ranges.first().map(|r| r.0)
    }

    /// Whether `v` is in the set.
    pub fn contains(&self, v: u128) -> bool {
        match self.ranges.binary_search_by(|&(a, _)| a.cmp(&v)) {
            Ok(_) => true,
            Err(0) => false,
            Err(i) => self.ranges[i - 1].1 >= v,
        }
    }

    /// Adds `v`.
    pub fn insert(&mut self, v: u128) {
        self.insert_range(v, v);
    }

    /// Adds every element of `start..=end` (no-op when `start > end`).
    pub fn insert_range(&mut self, start: u128, end: u128) {
        if start > end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // Ranges that overlap or touch [lo, hi] are merged into it.
        let first = self
            .ranges
            .partition_point(|&(_, b)| b < lo && b.saturating_add(1) < lo);
        let mut last = first;
        while last < self.ranges.len() {
            let (a, b) = self.ranges[last];
            if a > hi && a - 1 > hi {
                break;
            }
            lo = lo.min(a);
            hi = hi.max(b);
            last += 1;
        }
        self.ranges.splice(first..last, std::iter::once((lo, hi)));
    }

    /// Removes `v`.
    pub fn remove(&mut self, v: u128) {
        self.remove_range(v, v);
    }

    /// Removes every element of `start..=end`.
    pub fn remove_range(&mut self, start: u128, end: u128) {
        if start > end {
            return;
        }
        let first = self.ranges.partition_point(|&(_, b)| b < start);
        let mut replacement = Vec::with_capacity(2);
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].0 <= end {
            let (a, b) = self.ranges[last];
            if a < start {
                replacement.push((a, start - 1));
            }
            if b > end {
                replacement.push((end + 1, b));
            }
            last += 1;
        }
        self.ranges.splice(first..last, replacement);
    }

    /// Removes every element of `other`.
    pub fn subtract(&mut self, other: &RangeSet) {
        *self = self.difference(other);
    }

    /// The elements of `self` that are not in `other`, in one sweep:
    /// O(ranges of both).
    ///
    /// ```
    /// use metal_ipam_core::ip::RangeSet;
    /// let s = RangeSet::from_ranges([(0, 9), (20, 29)]);
    /// let d = s.difference(&RangeSet::from_ranges([(5, 22), (29, 40)]));
    /// assert_eq!(d.ranges(), &[(0, 4), (23, 28)]);
    /// ```
    pub fn difference(&self, other: &RangeSet) -> RangeSet {
        let minus = &other.ranges;
        let mut out = Vec::with_capacity(self.ranges.len());
        let mut j = 0;
        for &(a, b) in &self.ranges {
            let mut start = a;
            // Ranges of `other` ending before this one cannot touch later ones.
            while j < minus.len() && minus[j].1 < start {
                j += 1;
            }
            let mut k = j;
            let mut covered = false;
            while k < minus.len() && minus[k].0 <= b {
                let (xa, xb) = minus[k];
                if xa > start {
                    out.push((start, xa - 1));
                }
                if xb >= b {
                    covered = true;
                    break;
                }
                start = xb + 1;
                k += 1;
            }
            if !covered {
                out.push((start, b));
            }
            // The range of `other` at `k` may reach into the next one.
            j = k;
        }
        RangeSet { ranges: out }
    }

    /// Adds every element of `other`.
    pub fn union_with(&mut self, other: &RangeSet) {
        for &(a, b) in &other.ranges {
            self.insert_range(a, b);
        }
    }

    /// The elements of `self` that are also in `other`.
    pub fn intersection(&self, other: &RangeSet) -> RangeSet {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a1, b1) = self.ranges[i];
            let (a2, b2) = other.ranges[j];
            let lo = a1.max(a2);
            let hi = b1.min(b2);
            if lo <= hi {
                out.push((lo, hi));
            }
            if b1 < b2 {
                i += 1;
            } else {
                j += 1;
            }
        }
        RangeSet { ranges: out }
    }

    /// The smallest element of `self` that is not in `taken`, in
    /// O(ranges of both) time.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ip::RangeSet;
    /// let pool = RangeSet::from_ranges([(1, 10)]);
    /// let taken = RangeSet::from_ranges([(1, 3), (5, 5)]);
    /// assert_eq!(pool.first_not_in(&taken), Some(4));
    /// assert_eq!(pool.first_not_in(&RangeSet::from_ranges([(0, 10)])), None);
    /// ```
    pub fn first_not_in(&self, taken: &RangeSet) -> Option<u128> {
        let mut j = 0;
        for &(a, b) in &self.ranges {
            let mut candidate = a;
            loop {
                while j < taken.ranges.len() && taken.ranges[j].1 < candidate {
                    j += 1;
                }
                match taken.ranges.get(j) {
                    Some(&(ta, tb)) if ta <= candidate => {
                        if tb >= b {
                            break; // this pool range is fully taken from `candidate` on
                        }
                        candidate = tb + 1;
                    }
                    _ => return Some(candidate),
                }
            }
        }
        None
    }

    /// Iterates over the elements in ascending order (beware of huge sets).
    pub fn iter(&self) -> impl Iterator<Item = u128> + '_ {
        self.ranges.iter().flat_map(|&(a, b)| RangeIter {
            next: Some(a),
            end: b,
        })
    }
}

struct RangeIter {
    next: Option<u128>,
    end: u128,
}

impl Iterator for RangeIter {
    type Item = u128;
    fn next(&mut self) -> Option<u128> {
        let v = self.next?;
        self.next = if v < self.end { Some(v + 1) } else { None };
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn insert_merges_overlapping_and_adjacent_ranges() {
        let s = RangeSet::from_ranges([(5, 7), (1, 2), (3, 4), (10, 12), (8, 8)]);
        assert_eq!(s.ranges(), &[(1, 8), (10, 12)]);
    }

    #[test]
    fn extremes_do_not_overflow() {
        let mut s = RangeSet::new();
        s.insert_range(u128::MAX - 1, u128::MAX);
        s.insert_range(0, 0);
        assert_eq!(s.len(), 3);
        s.remove(u128::MAX);
        assert_eq!(s.ranges(), &[(0, 0), (u128::MAX - 1, u128::MAX - 1)]);
        let full = RangeSet::from_ranges([(0, u128::MAX)]);
        assert_eq!(full.len(), u128::MAX, "saturates");
        assert_eq!(full.first_not_in(&RangeSet::new()), Some(0));
        assert_eq!(full.first_not_in(&full), None);
    }

    #[test]
    fn subnet_bounds_of_v6_64() {
        let v = to_u128("2001:db8::1234".parse().unwrap());
        let (a, b) = subnet_bounds(Family::V6, v, 64);
        assert_eq!(from_u128(Family::V6, a).to_string(), "2001:db8::");
        assert_eq!(
            from_u128(Family::V6, b).to_string(),
            "2001:db8::ffff:ffff:ffff:ffff"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8),
        Remove(u8, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Insert(a.min(b), a.max(b))),
            (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Remove(a.min(b), a.max(b))),
        ]
    }

    proptest! {
        /// RangeSet behaves exactly like a BTreeSet of its elements, and
        /// stays normalised (sorted, disjoint, non-adjacent).
        #[test]
        fn rangeset_matches_btreeset(ops in proptest::collection::vec(op(), 0..40),
                                     taken in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..8)) {
            let mut s = RangeSet::new();
            let mut m = BTreeSet::new();
            for o in ops {
                match o {
                    Op::Insert(a, b) => { s.insert_range(a.into(), b.into()); m.extend(a..=b); }
                    Op::Remove(a, b) => { s.remove_range(a.into(), b.into()); for v in a..=b { m.remove(&v); } }
                }
                let got: Vec<u128> = s.iter().collect();
                let want: Vec<u128> = m.iter().map(|&v| u128::from(v)).collect();
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(s.len(), want.len() as u128);
                for w in s.ranges().windows(2) {
                    prop_assert!(w[0].1 + 1 < w[1].0, "not normalised: {:?}", s.ranges());
                }
                for v in 0..=255u128 { prop_assert_eq!(s.contains(v), m.contains(&(v as u8))); }
            }
            let t = RangeSet::from_ranges(taken.iter().map(|&(a, b)| (u128::from(a.min(b)), u128::from(a.max(b)))));
            let want = m.iter().map(|&v| u128::from(v)).find(|v| !t.contains(*v));
            prop_assert_eq!(s.first_not_in(&t), want);
            let inter: Vec<u128> = s.intersection(&t).iter().collect();
            let want_inter: Vec<u128> = m.iter().map(|&v| u128::from(v)).filter(|v| t.contains(*v)).collect();
            prop_assert_eq!(inter, want_inter);
        }
    }

    /// Far more entries than the cap, in random order: quadratic code would
    /// run for minutes here (about 10^10 range moves), the sweep takes
    /// milliseconds.
    #[test]
    fn the_sweep_is_not_quadratic() {
        let n = 200_000u128;
        let mut x: u128 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (n * 4)
        };
        let from: Vec<(u128, u128)> = (0..n).map(|_| next()).map(|a| (a * 4, a * 4 + 2)).collect();
        let minus: Vec<(u128, u128)> = (0..n)
            .map(|_| next())
            .map(|a| (a * 4 + 1, a * 4 + 1))
            .collect();
        let from = RangeSet::from_ranges(from);
        let minus = RangeSet::from_ranges(minus);
        let out = from.difference(&minus);
        let out = out.ranges();
        assert!(out.windows(2).all(|w| w[0].1 + 1 < w[1].0));
        assert!(out.len() >= from.ranges().len());
    }

    proptest::proptest! {
        /// The sweeps compute exactly what inserting and removing entries
        /// one by one computes.
        #[test]
        fn the_sweep_equals_one_by_one_set_operations(
            from in proptest::collection::vec((0u128..200, 0u128..12), 0..40),
            minus in proptest::collection::vec((0u128..200, 0u128..12), 0..40),
        ) {
            let from: Vec<(u128, u128)> = from.into_iter().map(|(a, l)| (a, a + l)).collect();
            let minus: Vec<(u128, u128)> = minus.into_iter().map(|(a, l)| (a, a + l)).collect();
            let mut want = RangeSet::new();
            for &(a, b) in &from {
                want.insert_range(a, b);
            }
            let configured = want.clone();
            for &(a, b) in &minus {
                want.remove_range(a, b);
            }
            let norm = RangeSet::from_ranges(from);
            proptest::prop_assert_eq!(norm.ranges(), configured.ranges());
            let got = norm.difference(&RangeSet::from_ranges(minus));
            proptest::prop_assert_eq!(got.ranges(), want.ranges());
        }
    }
}
