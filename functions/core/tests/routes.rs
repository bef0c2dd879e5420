//! The route table against `spin.toml`: every route the table names is
//! reachable on the component it names (public routes through the
//! triggers, chained ones through the callers' allowed hosts), and
//! nothing in `spin.toml` is unknown to the table.

use std::collections::BTreeSet;
use std::path::PathBuf;

use metal_ipam_core::routes::{Component, Route, RouteDef, TABLE};
use toml::Value;

/// The manifest: each trigger as (route, or `None` when private;
/// component), and each component's `allowed_outbound_hosts`.
struct Manifest {
    triggers: Vec<(Option<String>, String)>,
    hosts: Vec<(String, Vec<String>)>,
}

fn manifest() -> Manifest {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spin.toml");
    let text = std::fs::read_to_string(&path).expect("spin.toml at the repository root");
    let doc: Value = toml::from_str(&text).expect("spin.toml parses");
    let triggers = doc["trigger"]["http"]
        .as_array()
        .expect("[[trigger.http]]")
        .iter()
        .map(|t| {
            let route = match &t["route"] {
                Value::String(r) => Some(r.clone()),
                other => {
                    assert_eq!(other.get("private"), Some(&Value::Boolean(true)));
                    None
                }
            };
            (route, t["component"].as_str().unwrap().to_string())
        })
        .collect();
    let hosts = doc["component"]
        .as_table()
        .expect("[component.*]")
        .iter()
        .map(|(name, c)| {
            let hosts = c
                .get("allowed_outbound_hosts")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|h| h.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            (name.clone(), hosts)
        })
        .collect();
    Manifest { triggers, hosts }
}

/// The route of row `def` with made-up fields, and its path.
fn sample(def: &RouteDef) -> String {
    let template = def.template;
    let path: Vec<&str> = template
        .split('/')
        .map(|s| match s {
            // Only an in-cluster pool kind's name is a takeover route.
            "{kind}" => "InClusterIPPool",
            s if s.starts_with('{') => "x-1",
            s => s,
        })
        .collect();
    let path = path.join("/");
    assert_eq!(
        Route::parse(&path).map(|r| r.def()),
        Some(def),
        "{template}"
    );
    path
}

/// The component Spin routes a public `path` to: an exact route, else the
/// longest `/…` wildcard prefix that matches.
fn spin_route<'m>(m: &'m Manifest, path: &str) -> Option<(&'m str, &'m str)> {
    let mut best: Option<(&str, &str)> = None;
    for (route, component) in &m.triggers {
        let Some(route) = route.as_deref() else {
            continue;
        };
        if route == path {
            return Some((route, component));
        }
        if let Some(prefix) = route.strip_suffix("/...") {
            let under = path == prefix || path.starts_with(&format!("{prefix}/"));
            if under && best.is_none_or(|(b, _)| b.len() < route.len()) {
                best = Some((route, component));
            }
        }
    }
    best
}

fn name_of(c: Component) -> &'static str {
    c.name()
}

#[test]
fn the_components_are_the_manifests() {
    let m = manifest();
    let ours: BTreeSet<&str> = Component::ALL.iter().map(|c| c.name()).collect();
    let declared: BTreeSet<&str> = m.hosts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(ours, declared);
    let triggered: BTreeSet<&str> = m.triggers.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(ours, triggered, "every component has a trigger");
}

#[test]
fn public_routes_reach_the_component_the_table_names() {
    let m = manifest();
    for route in TABLE {
        let path = sample(route);
        let reached = spin_route(&m, &path).map(|(_, c)| c);
        if route.public {
            let served: Vec<&str> = route.served_by.iter().copied().map(name_of).collect();
            assert!(
                reached.is_some_and(|c| served.contains(&c)),
                "{path} reaches {reached:?}, the table says {served:?}"
            );
        } else {
            assert_eq!(reached, None, "{path} is chained only, yet public");
        }
    }
}

#[test]
fn chained_routes_are_allowed_hosts_of_their_callers() {
    let m = manifest();
    let hosts_of = |c: Component| {
        &m.hosts
            .iter()
            .find(|(n, _)| n == c.name())
            .expect("declared")
            .1
    };
    for route in TABLE {
        for caller in route.chained_from {
            for served in route.served_by {
                let host = format!("http://{}.spin.internal", served.name());
                assert!(
                    hosts_of(*caller).contains(&host),
                    "{} chains to {} but may not reach {host}",
                    caller.name(),
                    route.template
                );
            }
        }
    }
}

#[test]
fn nothing_in_the_manifest_is_unknown_to_the_table() {
    let m = manifest();
    let component = |name: &str| {
        *Component::ALL
            .iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("unknown component {name}"))
    };
    for (route, name) in &m.triggers {
        let c = component(name);
        let kinds: Vec<_> = TABLE.iter().filter(|k| k.served_by.contains(&c)).collect();
        match route {
            // A public trigger: some public route of the table arrives
            // through it on this component.
            Some(route) => assert!(
                kinds.iter().any(|k| k.public
                    && spin_route(&m, &sample(k)) == Some((route.as_str(), name.as_str()))),
                "{route} ({name}) serves no route of the table"
            ),
            // A private component: chained routes only.
            None => assert!(
                !kinds.is_empty()
                    && kinds
                        .iter()
                        .all(|k| !k.public && !k.chained_from.is_empty()),
                "{name} is private, yet the table has no chained route on it only"
            ),
        }
    }
    for (caller, hosts) in &m.hosts {
        let caller = component(caller);
        for host in hosts {
            let Some(target) = host
                .strip_prefix("http://")
                .and_then(|h| h.strip_suffix(".spin.internal"))
            else {
                continue;
            };
            let target = component(target);
            assert!(
                TABLE
                    .iter()
                    .any(|r| { r.served_by.contains(&target) && r.chained_from.contains(&caller) }),
                "{} may reach {host}, yet the table has no step of it chained from there",
                caller.name()
            );
        }
    }
}

/// The VLAN batch path `network::batch` builds is the table's.
#[test]
fn the_batch_path_is_the_tables() {
    let port = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a";
    assert_eq!(
        metal_ipam_core::network::batch::step_path(port),
        Route::VlanBatch { port: port.into() }.path()
    );
}
