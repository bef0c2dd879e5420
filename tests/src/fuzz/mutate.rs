//! Structural mutations of JSON documents and byte-level damage to their
//! serialisation.
//!
//! [`mutate_json`] picks random nodes of a document and drops, duplicates,
//! renames or retypes them, swaps in subtrees of other seed documents,
//! nests them deeply, or replaces strings with values that are interesting
//! for the field they sit in (IP strings for `addresses`, odd names for
//! `name`, near-miss vocabulary for `kind`/`type`/`apiVersion`, …).
//! [`serialize`] turns the document into bytes, expanding raw number
//! literals JSON values cannot hold (`1e400`, `-0`, `01`, …), and
//! [`damage_bytes`] then truncates, flips, splices invalid UTF-8, lone
//! surrogate escapes or duplicate keys into the text.

use serde_json::{Map, Value};

use super::rng::Rng;
use metal_ipam_core::http::api::MAX_BODY;

/// Keys the parsers look at (and a few they should not care about).
pub const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "uid",
    "spec",
    "status",
    "poolRef",
    "apiGroup",
    "addresses",
    "prefix",
    "gateway",
    "excludedAddresses",
    "preAllocations",
    "allocateReservedIPAddresses",
    "addressReuseGracePeriodSeconds",
    "annotations",
    "labels",
    "clusterName",
    "claimRef",
    "address",
    "finalizers",
    "deletionTimestamp",
    "resourceVersion",
    "type",
    "object",
    "body",
    "oldBody",
    "oldObject",
    "data",
    "data_base64",
    "specversion",
    "id",
    "source",
    "apiversion",
    "metalipamtoken",
    "request",
    "operation",
    "dryRun",
    "ipam.metal-ipam.dev/requested-address",
    "ipam.metal-ipam.dev/skip-validate-delete-webhook",
    "cluster.x-k8s.io/cluster-name",
    "cluster.x-k8s.io/paused",
    "",
    "\u{e9}",
];

/// IP-ish strings: valid and invalid addresses, ranges and CIDRs of both
/// families, edge prefixes, whole address spaces.
pub const IPS: &[&str] = &[
    "10.20.0.5",
    "10.20.0.0/24",
    "10.20.0.10-10.20.0.20",
    "10.20.0.20-10.20.0.10",
    "10.20.0.1",
    "10.20.0.255",
    "10.20.0.0",
    "10.20.0.50",
    "192.0.2.7",
    "0.0.0.0",
    "0.0.0.0/0",
    "0.0.0.0-255.255.255.255",
    "255.255.255.255",
    "255.255.255.255/32",
    "10.20.0.0/31",
    "10.20.0.0/32",
    "10.20.0.0/33",
    "10.20.0.0/-1",
    "10.20.0.0/",
    "10.20.0.0/024",
    "10.20.0.0/2a",
    "/24",
    "-",
    "--",
    "10.20.0.1-",
    "-10.20.0.1",
    "10.20.0.1--10.20.0.2",
    "10.20.0.1-10.20.0.2-10.20.0.3",
    "10.20.0.1 - 10.20.0.9",
    " 10.20.0.5 ",
    "10.20.0.5\n",
    "010.20.0.5",
    "10.20.0",
    "10.20.0.256",
    "1.2.3.4.5",
    "10.20.0.5/24/24",
    "10.20.0.0/24-10.20.1.0/24",
    "::",
    "::/0",
    "::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
    "::1",
    "2001:db8::/64",
    "2001:db8::/126",
    "2001:db8::/127",
    "2001:db8::/128",
    "2001:db8::/129",
    "2001:db8::1-2001:db8::ffff",
    "2001:db8::ffff-2001:db8::1",
    "2001:db8::1-10.20.0.1",
    "10.20.0.1-2001:db8::1",
    "::ffff:10.20.0.5",
    "::ffff:10.20.0.0/120",
    "fe80::1%eth0",
    "[::1]",
    "2001:db8:::1",
    "2001:db8::g",
    "\u{ff11}0.20.0.5",
    "10.20.0.5\u{0}",
    "",
    " ",
];

/// Names: valid, at and over the length limits, wrong characters, path
/// tricks, unicode.
pub const NAMES: &[&str] = &[
    "worker-0",
    "worker-bound",
    "worker-pre",
    "nodes",
    "edge",
    "tiny",
    "team-a",
    "team-b",
    "a",
    "0",
    "a.b",
    "a..b",
    ".a",
    "a.",
    "-a",
    "a-",
    "A",
    "Worker-0",
    "worker_0",
    "worker 0",
    "a/b",
    "..",
    ".",
    "%2F",
    "a%2Fb",
    "%2e%2e",
    "\u{e9}",
    "\u{1f600}",
    "\u{0}",
    "a\nb",
    "",
    " ",
];

/// Near-miss vocabulary for `apiVersion`, `kind`, `type`, `operation`, …
pub const VOCAB: &[&str] = &[
    "ipam.cluster.x-k8s.io/v1beta2",
    "ipam.cluster.x-k8s.io/v1beta1",
    "ipam.cluster.x-k8s.io/v1alpha1",
    "ipam.cluster.x-k8s.io",
    "ipam.cluster.x-k8s.io/",
    "/v1beta2",
    "ipam.metal-ipam.dev/v1alpha1",
    "ipam.metal-ipam.dev",
    "admission.k8s.io/v1",
    "admission.k8s.io/v1beta1",
    "v1",
    "IPAddressClaim",
    "IPAddress",
    "ipaddressclaim",
    "MetalIPPool",
    "GlobalMetalIPPool",
    "InClusterIPPool",
    "AdmissionReview",
    "ConfigMap",
    "ADDED",
    "MODIFIED",
    "DELETED",
    "BOOKMARK",
    "ERROR",
    "ADD",
    "UPDATE",
    "DELETE",
    "added",
    "Delete",
    "CREATE",
    "CONNECT",
    "dev.knative.apiserver.resource.add",
    "dev.knative.apiserver.resource.update",
    "dev.knative.apiserver.resource.delete",
    "dev.knative.apiserver.ref.add",
    "dev.knative.apiserver.ref.delete",
    "dev.knative.apiserver.ref.",
    "dev.knative.apiserver.resource.",
    "dev.knative.sources.ping",
    "1.0",
    "0.3",
    "1.0 ",
    "",
];

/// Raw JSON literals spliced into the text in place of a value (numbers a
/// `Value` cannot hold, near-miss keywords).
pub const RAW_LITERALS: &[&str] = &[
    "1e400",
    "-1e400",
    "-0",
    "0.0",
    "1.0",
    "1e2",
    "1E+2",
    "24.5",
    "01",
    "1.",
    ".5",
    "+1",
    "0x10",
    "340282366920938463463374607431768211456",
    "18446744073709551616",
    "18446744073709551615",
    "-9223372036854775809",
    "2147483648",
    "4294967296",
    "NaN",
    "Infinity",
    "tru",
    "nul",
    "True",
    "[]",
    "{}",
    "[[]]",
];

/// Marker of a raw literal inside a string value; [`serialize`] expands it.
const RAW_MARK: &str = "\u{1}RAW:";
/// The marker as `serde_json` writes it.
const RAW_MARK_JSON: &str = "\"\\u0001RAW:";

/// How much one mutation may add to a document, roughly in bytes of
/// JSON: big enough for long lists and strings near the body limit, small
/// enough that compounding mutations stay far from gigabytes.
const GROWTH_BUDGET: usize = 256 << 10;

/// About the size of `v` as JSON (at least 1).
fn approx_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(|e| approx_size(e) + 1).sum::<usize>() + 2,
        Value::Object(m) => {
            m.iter()
                .map(|(k, e)| k.len() + 4 + approx_size(e))
                .sum::<usize>()
                + 2
        }
        _ => 8,
    }
}

/// Array elements looked at per array (long lists: a sample is enough).
const ARRAY_SAMPLE: usize = 16;

/// Number of nodes [`nth_mut`] can reach.
fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Object(m) => m.values().map(count_nodes).sum(),
        Value::Array(a) => a.iter().take(ARRAY_SAMPLE).map(count_nodes).sum(),
        _ => 0,
    }
}

/// The `k`-th node in pre-order, and the dictionary that fits it (from
/// the nearest key above it, `key`, and the one above that, `outer`).
fn nth_mut<'a>(
    v: &'a mut Value,
    k: &mut usize,
    key: Option<&str>,
    outer: Option<&str>,
) -> Option<(&'a mut Value, Option<Dict>)> {
    if *k == 0 {
        return Some((v, context_of(key, outer)));
    }
    *k -= 1;
    match v {
        Value::Object(m) => {
            for (name, child) in m.iter_mut() {
                if let Some(r) = nth_mut(child, k, Some(name), key) {
                    return Some(r);
                }
            }
            None
        }
        Value::Array(a) => {
            for child in a.iter_mut().take(ARRAY_SAMPLE) {
                if let Some(r) = nth_mut(child, k, key, outer) {
                    return Some(r);
                }
            }
            None
        }
        _ => None,
    }
}

/// The `k`-th node in pre-order (read only).
fn nth<'a>(v: &'a Value, k: &mut usize) -> Option<&'a Value> {
    if *k == 0 {
        return Some(v);
    }
    *k -= 1;
    match v {
        Value::Object(m) => m.values().find_map(|c| nth(c, k)),
        Value::Array(a) => a.iter().take(ARRAY_SAMPLE).find_map(|c| nth(c, k)),
        _ => None,
    }
}

/// A dictionary of strings.
type Dict = &'static [&'static str];

/// Which dictionary fits a node, from the key it sits under (`key`) and
/// the key above that (`outer`).
fn context_of(key: Option<&str>, outer: Option<&str>) -> Option<Dict> {
    Some(match key {
        Some(
            "addresses"
            | "excludedAddresses"
            | "gateway"
            | "address"
            | "ipam.metal-ipam.dev/requested-address",
        ) => IPS,
        _ if outer == Some("preAllocations") => IPS,
        Some(
            "name" | "namespace" | "clusterName" | "uid" | "cluster.x-k8s.io/cluster-name" | "id",
        ) => NAMES,
        Some(
            "apiVersion" | "kind" | "type" | "operation" | "apiGroup" | "specversion"
            | "apiversion" | "group" | "version",
        ) => VOCAB,
        _ => return None,
    })
}

fn any_dict(rng: &mut Rng) -> Dict {
    rng.pick_copy(&[IPS, NAMES, VOCAB, KEYS])
}

fn raw(literal: &str) -> Value {
    Value::String(format!("{RAW_MARK}{literal}"))
}

/// A value of a random JSON type (the "wrong type" mutation).
fn wrong_type(rng: &mut Rng) -> Value {
    match rng.below(14) {
        0 => Value::Null,
        1 => Value::Bool(true),
        2 => Value::Bool(false),
        3 => 0.into(),
        4 => (-1).into(),
        5 => u64::MAX.into(),
        6 => i64::MIN.into(),
        7 => 1.5.into(),
        8 => 1e308.into(),
        9 => Value::String(String::new()),
        10 => Value::Array(Vec::new()),
        11 => Value::Object(Map::new()),
        12 => Value::Array(vec![Value::String(rng.pick_copy(IPS).into())]),
        _ => raw(rng.pick_copy(RAW_LITERALS)),
    }
}

/// A number, valid or not for the field it lands in.
fn number(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => 0.into(),
        1 => 24.into(),
        2 => 32.into(),
        3 => 33.into(),
        4 => 64.into(),
        5 => 128.into(),
        6 => 129.into(),
        7 => 255.into(),
        8 => 256.into(),
        9 => i64::from(i32::MAX).into(),
        10 => (i64::from(i32::MAX) + 1).into(),
        _ => raw(rng.pick_copy(RAW_LITERALS)),
    }
}

/// Small edits of a string that keep it close to the original.
pub fn tweak_string(rng: &mut Rng, s: &str) -> String {
    let mut s = s.to_string();
    match rng.below(12) {
        0 => s.push_str(rng.pick_copy(&["-", ".", "/", " ", "\u{e9}", "\0", "%", "%2F", ".."])),
        1 => s.insert_str(
            0,
            rng.pick_copy(&["-", ".", "/", " ", "\u{feff}", "..", "a"]),
        ),
        2 => s = s.to_uppercase(),
        3 => {
            let keep = rng.below(s.chars().count() + 1);
            s = s.chars().take(keep).collect();
        }
        4 => {
            // Exactly at and just over the name limits, and far over.
            let len = rng.pick_copy(&[63usize, 64, 253, 254, 4096]);
            let fill = if s.is_empty() {
                "a".to_string()
            } else {
                s.clone()
            };
            s = fill.repeat(len / fill.len() + 1);
            let mut cut = len;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        5 if s.len() < GROWTH_BUDGET => s = format!("{s}/{s}"),
        6 => s = s.replace('.', ":"),
        7 => s = s.replace('-', "_"),
        8 => {
            if let Some((i, _)) = s.char_indices().nth(rng.below(s.chars().count().max(1))) {
                s.insert(
                    i,
                    rng.pick_copy(&['\u{e9}', '\u{200b}', '/', '%', '\u{0}', '\u{ffff}']),
                );
            }
        }
        9 if s.len() < GROWTH_BUDGET => s = format!("{s}{s}"),
        10 => s = s.trim().to_string() + "\t",
        _ => s.clear(),
    }
    s
}

/// A copy of a random node of a random donor document.
/// One of `m`'s member names, picked at random (`m` is not empty).
fn random_key(rng: &mut Rng, m: &serde_json::Map<String, Value>) -> String {
    m.keys()
        .nth(rng.below(m.len()))
        .cloned()
        .unwrap_or_default()
}

fn donor_subtree(rng: &mut Rng, donors: &[Value]) -> Value {
    if donors.is_empty() {
        return Value::Null;
    }
    let d = rng.pick(donors);
    let mut k = rng.below(count_nodes(d));
    nth(d, &mut k).cloned().unwrap_or_default()
}

/// Wraps `v` in `depth` arrays or objects (serde_json refuses more than
/// 128 levels; both sides of that limit are generated).
fn nest(rng: &mut Rng, v: Value) -> Value {
    let depth = rng.pick_copy(&[1usize, 2, 8, 64, 125, 126, 127, 128, 129, 200]);
    let as_object = rng.chance(1, 2);
    let mut out = v;
    for _ in 0..depth {
        out = if as_object {
            let mut m = Map::new();
            m.insert("spec".into(), out);
            Value::Object(m)
        } else {
            Value::Array(vec![out])
        };
    }
    out
}

/// Applies one to a few random structural mutations to `doc`; `donors`
/// provide subtrees to splice in (other seed documents).
pub fn mutate_json(rng: &mut Rng, doc: &mut Value, donors: &[Value]) {
    for _ in 0..rng.small_count(6) {
        mutate_once(rng, doc, donors);
    }
}

fn mutate_once(rng: &mut Rng, doc: &mut Value, donors: &[Value]) {
    let mut k = rng.below(count_nodes(doc));
    let Some((node, context)) = nth_mut(doc, &mut k, None, None) else {
        return;
    };
    let dict = match context {
        Some(d) if rng.chance(4, 5) => d,
        _ => any_dict(rng),
    };
    match rng.below(16) {
        0 => *node = wrong_type(rng),
        1 | 2 => *node = Value::String(rng.pick_copy(dict).to_string()),
        3 | 4 => {
            let s = match node {
                Value::String(s) => s.clone(),
                _ => rng.pick_copy(dict).to_string(),
            };
            *node = Value::String(tweak_string(rng, &s));
        }
        5 => *node = number(rng),
        6 => match node {
            // Drop a member / an element.
            Value::Object(m) if !m.is_empty() => {
                let k = random_key(rng, m);
                m.remove(&k);
            }
            Value::Array(a) if !a.is_empty() => {
                a.remove(rng.below(a.len()));
            }
            _ => *node = Value::Null,
        },
        7 | 8 => match node {
            // Add a member the parsers know (or not), with a random value.
            Value::Object(m) => {
                let k = rng.pick_copy(KEYS).to_string();
                let v = if rng.chance(1, 2) {
                    donor_subtree(rng, donors)
                } else {
                    Value::String(rng.pick_copy(dict).to_string())
                };
                m.insert(k, v);
            }
            Value::Array(a) => {
                let e = if a.is_empty() {
                    None
                } else {
                    a.get(rng.below(a.len()))
                };
                let v = if let Some(e) = e.filter(|e| approx_size(e) < GROWTH_BUDGET) {
                    e.clone()
                } else {
                    Value::String(rng.pick_copy(dict).to_string())
                };
                let at = rng.below(a.len() + 1);
                a.insert(at, v);
            }
            _ => *node = donor_subtree(rng, donors),
        },
        9 => match node {
            // Rename a member: case, whitespace, a neighbour's name.
            Value::Object(m) if !m.is_empty() => {
                let k = random_key(rng, m);
                let v = m.remove(&k).unwrap_or_default();
                let nk = match rng.below(4) {
                    0 => k.to_lowercase(),
                    1 => k.to_uppercase(),
                    2 => format!("{k} "),
                    _ => rng.pick_copy(KEYS).to_string(),
                };
                m.insert(nk, v);
            }
            Value::Array(a) => a.reverse(),
            _ => *node = Value::String(tweak_string(rng, "")),
        },
        10 => {
            let v = node.take();
            *node = nest(rng, v);
        }
        11 | 12 => *node = donor_subtree(rng, donors),
        13 => match node {
            // Many copies: long lists, huge strings.
            Value::Array(a) if !a.is_empty() => {
                let n = rng.pick_copy(&[2usize, 2, 10, 10, 30, 300, 300, 3000]);
                let e = a[rng.below(a.len())].clone();
                let n = n.min(GROWTH_BUDGET / approx_size(&e));
                a.extend(std::iter::repeat_n(e, n));
            }
            Value::String(s) => {
                let n = rng.pick_copy(&[2usize, 2, 10, 10, 100, 100, 1000, 20_000]);
                *s = s.repeat(n.min(GROWTH_BUDGET / (s.len() + 1)).max(1));
            }
            _ => {
                let s = rng.pick_copy(dict).to_string();
                *node = Value::Array(vec![Value::String(s); 100]);
            }
        },
        14 => *node = raw(rng.pick_copy(RAW_LITERALS)),
        _ => {
            // A list of distinct entries (many ranges in a pool).
            let n = rng.pick_copy(&[2usize, 5, 5, 20, 20, 50, 200, 1000]);
            let base = rng.below(200);
            *node = Value::Array(
                (0..n)
                    .map(|i| Value::String(format!("10.{}.{}.{}", base, (i / 256) % 256, i % 256)))
                    .collect(),
            );
        }
    }
}

/// The document as JSON bytes, with raw-literal markers expanded.
pub fn serialize(doc: &Value) -> Vec<u8> {
    let text = serde_json::to_string(doc).unwrap_or_default();
    if !text.contains(RAW_MARK_JSON) {
        return text.into_bytes();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find(RAW_MARK_JSON) {
        out.push_str(&rest[..i]);
        let after = &rest[i + RAW_MARK_JSON.len()..];
        // Literals contain no quote or backslash: the string ends at the next quote.
        let end = after.find('"').unwrap_or(after.len());
        out.push_str(&after[..end]);
        rest = after.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out.into_bytes()
}

/// Byte sequences that are not UTF-8, or JSON escapes of invalid code
/// points.
const BAD_BYTES: &[&[u8]] = &[
    b"\xff",
    b"\xc3",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xc0\x80",
    b"\xef\xbb\xbf",
    b"\x00",
    b"\\ud800",
    b"\\udfff",
    b"\\u0000",
    b"\\",
    b"\\x41",
];

/// Damages the serialised bytes once or a few times: truncation, bit
/// flips, invalid UTF-8, lone surrogates, duplicate keys, deleted or
/// repeated spans, garbage around the document.
pub fn damage_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.small_count(4) {
        let len = bytes.len();
        match rng.below(12) {
            0 => bytes.truncate(rng.below(len + 1)),
            1 if len > 0 => {
                let i = rng.below(len);
                bytes[i] ^= 1 << rng.below(8);
            }
            2 if len > 0 => {
                let i = rng.below(len);
                bytes[i] = rng.pick_copy(b"\x00\xff\x80\"{}[]:,\\ \n0-.");
            }
            3 | 4 => {
                // Inside a string most of the time: right after a quote.
                let quotes: Vec<usize> = bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'"')
                    .map(|(i, _)| i + 1)
                    .collect();
                let at = if quotes.is_empty() {
                    rng.below(len + 1)
                } else {
                    rng.pick_copy(&quotes)
                };
                let ins = rng.pick(BAD_BYTES);
                bytes.splice(at..at, ins.iter().copied());
            }
            5 => {
                // A duplicate key at the start of some object.
                let braces: Vec<usize> = bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'{')
                    .map(|(i, _)| i + 1)
                    .collect();
                if let Some(&at) = braces.get(rng.below(braces.len().max(1))) {
                    let key = rng.pick(KEYS);
                    let val = rng.pick(&[
                        "\"x\"",
                        "1",
                        "null",
                        "{}",
                        "[]",
                        "\"10.20.0.5\"",
                        "\"team-a\"",
                        "\"ADDED\"",
                    ]);
                    let ins = format!("{}:{val},", Value::String((*key).into()));
                    bytes.splice(at..at, ins.into_bytes());
                }
            }
            6 if len > 0 => {
                let a = rng.below(len);
                let b = (a + rng.range(1, 32)).min(len);
                bytes.drain(a..b);
            }
            7 if len > 0 => {
                let a = rng.below(len);
                let b = (a + rng.range(1, 64)).min(len);
                let span = bytes[a..b].to_vec();
                bytes.splice(b..b, span);
            }
            8 => {
                let pre: &[u8] =
                    rng.pick_copy(&[&b"\xef\xbb\xbf"[..], b" \n\t", b"\x00", b"[", b"]"]);
                bytes.splice(0..0, pre.iter().copied());
            }
            9 => {
                let post: &[u8] = rng.pick_copy(&[&b"}"[..], b",", b" 1", b"{}", b"\x00", b" \n"]);
                bytes.extend_from_slice(post);
            }
            10 => {
                let n = rng.below(64);
                *bytes = (0..n).map(|_| rng.next_u64() as u8).collect();
            }
            _ => {
                if rng.chance(1, 2) {
                    bytes.clear();
                } else {
                    *bytes = b" \r\n\t ".to_vec();
                }
            }
        }
    }
}

/// A body just over [`MAX_BODY`]: the document padded with whitespace
/// (every parser must refuse it without reading it).
pub fn oversized(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_BODY + 1 + bytes.len());
    out.extend_from_slice(bytes);
    out.resize(MAX_BODY + 1, b' ');
    out
}

/// Standard base64 with padding (for `data_base64` seeds).
pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = c.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - c.len()));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_literals_are_spliced() {
        let doc = serde_json::json!({"a": raw("1e400"), "b": [raw("-0"), "x"]});
        assert_eq!(
            String::from_utf8(serialize(&doc)).unwrap(),
            r#"{"a":1e400,"b":[-0,"x"]}"#
        );
    }

    #[test]
    fn base64_vectors() {
        for (dec, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(dec.as_bytes()), enc);
        }
    }

    #[test]
    fn compounding_mutations_stay_bounded() {
        let seed = serde_json::json!({"spec": {"addresses": ["10.0.0.0/24"], "prefix": 24,
            "preAllocations": {"m-0": "10.0.0.5"}}, "metadata": {"name": "p"}});
        let mut largest = 0;
        for s in 0..3000 {
            let mut rng = Rng::new(s);
            let mut d = seed.clone();
            for _ in 0..4 {
                mutate_json(&mut rng, &mut d, std::slice::from_ref(&seed));
            }
            largest = largest.max(serialize(&d).len());
        }
        assert!(largest < 8 << 20, "a document grew to {largest} bytes");
    }

    #[test]
    fn mutations_stay_deterministic() {
        let seed = serde_json::json!({"spec": {"addresses": ["10.0.0.0/24"], "prefix": 24}});
        let run = |s| {
            let mut rng = Rng::new(s);
            let mut d = seed.clone();
            mutate_json(&mut rng, &mut d, std::slice::from_ref(&seed));
            let mut b = serialize(&d);
            damage_bytes(&mut rng, &mut b);
            b
        };
        for s in 0..200 {
            assert_eq!(run(s), run(s));
        }
    }
}
