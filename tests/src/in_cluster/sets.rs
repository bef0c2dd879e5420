//! Address sets for the emulation: what `go4.org/netipx`'s `IPSet` does for
//! the in-cluster provider (`internal/poolutil/pool.go`), on sorted ranges of
//! 128-bit integers.
//!
//! IPv4 addresses are held as IPv4-mapped IPv6 (`::ffff:a.b.c.d`) so one
//! integer line carries both families; a pool holds one family (the
//! provider's webhook refuses mixed pools), and every value is turned back
//! into the family it came from.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

/// The integer of an address (IPv4 mapped into IPv6).
pub(crate) fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of an integer, in the family `v4` names.
pub(crate) fn from_int(n: u128, v4: bool) -> IpAddr {
    let v6 = Ipv6Addr::from(n);
    match (v4, v6.to_ipv4_mapped()) {
        (true, Some(a)) => IpAddr::V4(a),
        _ => IpAddr::V6(v6),
    }
}

/// How many address bits a family has.
pub(crate) fn family_bits(v4: bool) -> u32 {
    if v4 {
        32
    } else {
        128
    }
}

/// The first and last integer of a prefix (host bits ignored, as
/// `netipx.RangeOfPrefix` masks).
pub(crate) fn prefix_range(net: IpNet) -> (u128, u128) {
    (to_int(net.network()), to_int(net.broadcast()))
}

/// A set of addresses as disjoint, sorted, non-adjacent inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    ranges: Vec<(u128, u128)>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// The ranges, lowest first.
    pub fn ranges(&self) -> &[(u128, u128)] {
        &self.ranges
    }

    /// Adds `lo..=hi`.
    pub fn add(&mut self, lo: u128, hi: u128) {
        if lo > hi {
            return;
        }
        self.ranges.push((lo, hi));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(self.ranges.len());
        for &(a, b) in &self.ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.ranges = merged;
    }

    /// Adds every range of `other`.
    pub fn add_set(&mut self, other: &RangeSet) {
        for &(a, b) in &other.ranges {
            self.add(a, b);
        }
    }

    /// Removes `lo..=hi`.
    pub fn remove(&mut self, lo: u128, hi: u128) {
        if lo > hi {
            return;
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b < lo || a > hi {
                out.push((a, b));
                continue;
            }
            if a < lo {
                out.push((a, lo - 1));
            }
            if b > hi {
                out.push((hi + 1, b));
            }
        }
        self.ranges = out;
    }

    /// Removes every range of `other`.
    pub fn remove_set(&mut self, other: &RangeSet) {
        for &(a, b) in &other.ranges {
            self.remove(a, b);
        }
    }

    /// Whether `x` is in the set.
    pub fn contains(&self, x: u128) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= x && x <= b)
    }

    /// Whether every address of `lo..=hi` is in the set.
    pub fn contains_range(&self, lo: u128, hi: u128) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= lo && hi <= b)
    }

    /// Whether any address of `lo..=hi` is in the set.
    pub fn overlaps(&self, lo: u128, hi: u128) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= hi && lo <= b)
    }

    /// How many addresses the set holds, capped at Go's `math.MaxInt` on
    /// 64-bit (`IPSetCount`).
    pub fn count(&self) -> i64 {
        let mut total: u128 = 0;
        for &(a, b) in &self.ranges {
            total = total.saturating_add(b - a).saturating_add(1);
        }
        i64::try_from(total).unwrap_or(i64::MAX)
    }

    /// The lowest address of the set not in `used`
    /// (`poolutil.FindFreeAddress`: each range walked from its first
    /// address).
    pub fn lowest_not_in(&self, used: &RangeSet) -> Option<u128> {
        for &(a, b) in &self.ranges {
            let mut x = a;
            loop {
                match used.ranges.iter().find(|&&(ua, ub)| ua <= x && x <= ub) {
                    None => return Some(x),
                    Some(&(_, ub)) if ub >= b => break,
                    Some(&(_, ub)) => x = ub + 1,
                }
            }
        }
        None
    }
}

/// One entry of `spec.addresses`/`spec.excludedAddresses`: a single IP, an
/// `a-b` range or a CIDR (`poolutil.AddressToIPSet`). The bool says IPv4.
///
/// # Errors
/// If the entry does not parse.
pub(crate) fn parse_entry(entry: &str) -> Result<(RangeSet, bool), String> {
    let mut set = RangeSet::new();
    let v4;
    if let Some((from, to)) = entry.split_once('-') {
        let from = IpAddr::from_str(from.trim()).map_err(|e| format!("{entry:?}: {e}"))?;
        let to = IpAddr::from_str(to.trim()).map_err(|e| format!("{entry:?}: {e}"))?;
        if from.is_ipv4() != to.is_ipv4() || to_int(from) > to_int(to) {
            return Err(format!("{entry:?}: not a range"));
        }
        v4 = from.is_ipv4();
        set.add(to_int(from), to_int(to));
    } else if entry.contains('/') {
        let net = IpNet::from_str(entry).map_err(|e| format!("{entry:?}: {e}"))?;
        v4 = matches!(net, IpNet::V4(_));
        let (a, b) = prefix_range(net);
        set.add(a, b);
    } else {
        let ip = IpAddr::from_str(entry).map_err(|e| format!("{entry:?}: {e}"))?;
        v4 = ip.is_ipv4();
        set.add(to_int(ip), to_int(ip));
    }
    Ok((set, v4))
}

/// The union of entries (`poolutil.AddressesToIPSet`). The bool says IPv4
/// (of the first entry; `true` when there is none).
///
/// # Errors
/// If an entry does not parse.
pub(crate) fn parse_entries<'a>(
    entries: impl IntoIterator<Item = &'a str>,
) -> Result<(RangeSet, bool), String> {
    let mut set = RangeSet::new();
    let mut family = None;
    for e in entries {
        let (s, v4) = parse_entry(e)?;
        family.get_or_insert(v4);
        set.add_set(&s);
    }
    Ok((set, family.unwrap_or(true)))
}

/// `a.b.c.d` for an integer from an IPv4 pool, else IPv6 text.
pub(crate) fn show(n: u128, v4: bool) -> String {
    from_int(n, v4).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> u128 {
        to_int(s.parse().unwrap())
    }

    #[test]
    fn entries_ranges_and_cidrs() {
        let (s, v4) = parse_entries(["10.0.0.10", "10.0.0.24-10.0.0.32", "10.0.0.128/30"]).unwrap();
        assert!(v4);
        assert_eq!(s.count(), 1 + 9 + 4);
        assert!(s.contains(ip("10.0.0.131")));
        assert!(!s.contains(ip("10.0.0.11")));
        let (s6, v4) = parse_entries(["fd00::/126"]).unwrap();
        assert!(!v4);
        assert_eq!(s6.count(), 4);
        assert!(parse_entry("10.0.0.9-10.0.0.1").is_err());
        assert!(parse_entry("nonsense").is_err());
    }

    #[test]
    fn remove_and_lowest() {
        let (mut s, _) = parse_entries(["10.0.0.0/29"]).unwrap();
        s.remove(ip("10.0.0.0"), ip("10.0.0.0"));
        s.remove(ip("10.0.0.3"), ip("10.0.0.4"));
        assert_eq!(s.count(), 5);
        let (used, _) = parse_entries(["10.0.0.1", "10.0.0.2", "10.0.0.5"]).unwrap();
        assert_eq!(
            s.lowest_not_in(&used).map(|n| show(n, true)),
            Some("10.0.0.6".into())
        );
        let (all, _) = parse_entries(["10.0.0.0/29"]).unwrap();
        assert_eq!(s.lowest_not_in(&all), None);
    }

    #[test]
    fn count_caps_at_max_int() {
        let (s, _) = parse_entries(["fd00::/48"]).unwrap();
        assert_eq!(s.count(), i64::MAX);
    }
}
