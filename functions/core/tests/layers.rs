//! The core's import picture: every arrow points down, no circle.
//!
//! The top-level modules sit in layers (inner first); a module may name
//! only modules of lower layers (`crate::x` in code, comments aside).
//! Inside a top-level module, the submodules' imports of each other
//! (`super::x`, `crate::top::x`) form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, inner first. `testing` is outside: it may use anything and
/// nothing but tests use it.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["ports", "ip"],
    &["kv", "cloud"],
    &["kube", "metal", "pnap"],
    &["ipam"],
    &["routes"],
    &["network", "provision"],
    &["observe"],
    &["reconcile"],
    &["capi"],
    &["events", "admission"],
    &["http"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without `//` comments (doc links name modules freely)
/// and without its unit tests (a `#[cfg(test)]` module at the end).
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("readable source file");
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            let l = lines[i].trim();
            (l == "#[cfg(test)]" || l.starts_with("#[cfg(all(test"))
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path following `prefix` in `code`, grouped imports expanded:
/// `crate::{a, b::{c, d}}` after `crate::` is `a`, `b::c` and `b::d`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        // `crate::` not as part of a longer path such as `my_crate::`.
        let inside_a_name = code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !inside_a_name {
            use_tree(&code[i + prefix.len()..], String::new(), &mut out);
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Reads one use tree (`a::b`, `a::{b, c::d}`, `{a, b}`) at the start of
/// `rest`, pushing each full path (prefixed by `base`); returns how many
/// bytes it read.
fn use_tree(rest: &str, base: String, out: &mut Vec<String>) -> usize {
    let name_end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let name = &rest[..name_end];
    let path = match (base.is_empty(), name.is_empty()) {
        (_, true) => base,
        (true, false) => name.to_string(),
        (false, false) => format!("{base}::{name}"),
    };
    let after = &rest[name_end..];
    if let Some(group) = after.strip_prefix("::").filter(|_| !name.is_empty()) {
        return name_end + 2 + use_tree(group, path, out);
    }
    let Some(mut group) = after.strip_prefix('{') else {
        out.push(path);
        return name_end;
    };
    let mut read = name_end + 1;
    loop {
        let blank = group.len() - group.trim_start().len();
        group = &group[blank..];
        read += blank;
        let n = use_tree(group, path.clone(), out);
        // Up to the next `,` or the closing `}` (an `as` rename, a comment
        // left by the stripping, nested whitespace).
        let tail = &group[n..];
        let Some(stop) = tail.find([',', '}']) else {
            return read + group.len();
        };
        read += n + stop + 1;
        group = &tail[stop + 1..];
        if tail[stop..].starts_with('}') {
            return read;
        }
    }
}

/// Every identifier following `prefix` in `code` (the first segment of
/// each path, grouped imports expanded).
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    paths_after(code, prefix)
        .into_iter()
        .map(|p| p.split("::").next().unwrap_or_default().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// (top-level module, submodule) of a source file, relative to `src/`.
fn place(rel: &Path) -> (String, Option<String>) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let top = parts[0].clone();
    let sub = parts.get(1).filter(|s| *s != "mod").cloned();
    (top, sub)
}

fn sources() -> Vec<(String, Option<String>, bool, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "lib.rs"))
        .map(|f| {
            let rel = f.strip_prefix(&src).expect("under src").to_path_buf();
            let (top, sub) = place(&rel);
            // A file one level down (`top/sub.rs`) reads `super::` as `top`.
            let direct = rel.iter().count() == 2;
            (top, sub, direct, code(&f))
        })
        .collect()
}

#[test]
fn every_import_points_to_a_lower_layer() {
    let mut wrong = BTreeSet::new();
    for (top, _, _, code) in sources() {
        let Some(from) = layer(&top) else {
            assert_eq!(top, "testing", "module {top} is in no layer");
            continue;
        };
        for used in names_after(&code, "crate::") {
            let used = used.as_str();
            if used == top || used == "Error" || used == "Result" || used == "ErrorKind" {
                continue;
            }
            match layer(used) {
                Some(to) if to < from => {}
                Some(_) => {
                    wrong.insert(format!("{top} -> {used}"));
                }
                // Items of the crate root (MAX_BODY_BYTES and the like).
                None => assert!(
                    used.chars().all(|c| c.is_uppercase() || c == '_')
                        || used.chars().next().is_some_and(char::is_uppercase),
                    "{top} names crate::{used}, which is in no layer"
                ),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports running up or sideways: {wrong:?}"
    );
}

#[test]
fn submodules_import_each_other_without_a_circle() {
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (top, sub, direct, code) in sources() {
        let Some(sub) = sub else { continue };
        // `crate::top::x` and `crate::{top::{x, y}}` alike.
        let inside = format!("{top}::");
        let mut used: Vec<String> = paths_after(&code, "crate::")
            .iter()
            .filter_map(|p| p.strip_prefix(&inside))
            .map(|p| p.split("::").next().unwrap_or_default().to_string())
            .collect();
        if direct {
            used.extend(names_after(&code, "super::"));
        }
        let out = edges.entry((top.clone(), sub.clone())).or_default();
        out.extend(used.into_iter().filter(|u| *u != sub));
    }
    // Depth-first search for a back edge within each top-level module.
    fn visit(
        node: &(String, String),
        edges: &BTreeMap<(String, String), BTreeSet<String>>,
        path: &mut Vec<(String, String)>,
        done: &mut BTreeSet<(String, String)>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            return Some(path[i..].iter().map(|(t, s)| format!("{t}::{s}")).collect());
        }
        if !done.insert(node.clone()) {
            return None;
        }
        path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            let n = (node.0.clone(), next.clone());
            if edges.contains_key(&n) {
                if let Some(c) = visit(&n, edges, path, done) {
                    return Some(c);
                }
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        let cycle = visit(node, &edges, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "a circle of imports: {cycle:?}");
    }
}

#[test]
fn the_checker_sees_an_upward_arrow() {
    // The scanner itself: an import is found, a comment is not.
    let code = "use crate::ipam::ops;\n let x = my_crate::http::y;";
    assert_eq!(names_after(code, "crate::"), ["ipam"]);
    // Grouped imports, nested and spread over lines, are read too.
    let grouped = "use crate::{\n    error::Result,\n    ipam::{ops, pool as p},\n    kv::{self, Ctx},\n};\nuse super::{claim, objects::paused};";
    assert_eq!(
        paths_after(grouped, "crate::"),
        [
            "error::Result",
            "ipam::ops",
            "ipam::pool",
            "kv::self",
            "kv::Ctx"
        ]
    );
    assert_eq!(names_after(grouped, "super::"), ["claim", "objects"]);
    assert_eq!(names_after("crate::kube::Kube<'_, H>", "crate::"), ["kube"]);
    assert_eq!(layer("http"), Some(LAYERS.len() - 1));
    assert!(layer("kv") < layer("ipam"));
}
