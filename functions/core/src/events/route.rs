//! Routing: which step components an event is forwarded to, by service
//! chaining, and on which paths ([`crate::routes`]'s steps), and what
//! follows a step from its answer. The `events` component
//! ([`crate::http::components::events`]) sends the requests; this decides
//! them from the parsed event and the steps' typed answers.

use serde_json::Value;

use super::{Action, ObjectEvent, ObjectKind};
use crate::ipam::claim::IpAddressSpec;
use crate::ipam::pool::{PoolId, PoolKind};
use crate::kube::names;
use crate::routes::{Answer, Call, Component, Route};

/// Which components and paths an event is forwarded to, by service
/// chaining, in order.
///
/// Claims go to `allocate` (created/updated and not deleting) or `release`
/// (deleted, or carrying a `deletionTimestamp`); an `IPAddress` event is a
/// hint about its claim (same name: re-create it if it was deleted) and,
/// when the object names one of our pools, about that pool's status
/// counts; pools go to `pools`, and a VRF-backed one (the object has
/// `spec.metal`) to `provision` as well; Machines go to `network` (their
/// network profile); a `MetalNetworkProfile` or a `PacketMachine` goes to
/// `network`, which names the Machines it concerns (those using the
/// profile; those whose infrastructure machine it is), and the `events`
/// component syncs each of them. (Whether a claim's pool is
/// VRF-backed is not in the event: the claim step says so in its answer,
/// and the `events` component then forwards to `assign`.)
///
/// # Examples
/// ```
/// use metal_ipam_core::events::route::route_event;
/// use metal_ipam_core::events::{ObjectEvent, ObjectKind, Action, Format};
/// let ev = ObjectEvent { kind: ObjectKind::Claim, action: Action::Delete, namespace: Some("ns".into()),
///     name: "m-0".into(), api_version: "ipam.cluster.x-k8s.io/v1beta2".into(), object: None,
///     format: Format::Watch, id: None };
/// assert_eq!(route_event(&ev), vec![("release", "/v1/capi/claims/ns/m-0".to_string())]);
/// ```
pub fn route_event(ev: &ObjectEvent) -> Vec<(&'static str, String)> {
    calls(ev)
        .into_iter()
        .map(|c| (c.component.name(), c.step.path()))
        .collect()
}

/// [`route_event`] as typed calls: the steps an event goes to, in order.
pub fn calls(ev: &ObjectEvent) -> Vec<Call> {
    let ns = ev.namespace.clone().unwrap_or_default();
    let name = ev.name.clone();
    // The object is a hint (it may be stale or forged; the steps re-read
    // it): only the fields routing needs are read. (Reading its whole
    // metadata as `kube::object::ObjectMeta` would cost this component
    // 6.4 KB of wasm for one timestamp.)
    match ev.kind {
        ObjectKind::Claim => {
            let deleting = ev.action == Action::Delete
                || pointer(ev, "/metadata/deletionTimestamp").is_some_and(|v| !v.is_null());
            let component = if deleting {
                Component::Release
            } else {
                Component::Allocate
            };
            vec![Call::new(component, Route::Claim { ns, name })]
        }
        ObjectKind::IpAddress => ip_address(ev, ns),
        // A Machine's network profile: applied, or released once removed
        // (the step re-reads the Machine; a deleted one needs nothing).
        ObjectKind::Machine => vec![Call::new(Component::Network, Route::Machine { ns, name })],
        // The Machines it concerns are listed by the network step (the
        // event may be a Reference-mode one, or the object stale).
        ObjectKind::NetworkProfile => vec![Call::new(
            Component::Network,
            Route::ProfileMachines { ns, name },
        )],
        ObjectKind::PacketMachine => vec![Call::new(
            Component::Network,
            Route::PacketMachineMachines { ns, name },
        )],
        ObjectKind::Pool(kind) => pool(ev, kind, ns),
    }
}

fn pointer<'a>(ev: &'a ObjectEvent, at: &str) -> Option<&'a Value> {
    ev.object.as_ref().and_then(|o| o.pointer(at))
}

/// An `IPAddress` event: its claim (named in `spec.claimRef`, else the
/// same name), and its pool's status when the pool is one of ours.
fn ip_address(ev: &ObjectEvent, ns: String) -> Vec<Call> {
    let spec = ev
        .object
        .as_ref()
        .and_then(|o| o.get("spec"))
        .map(IpAddressSpec::from_json)
        .unwrap_or_default();
    let claim = spec
        .claim_ref
        .as_ref()
        .map(|r| r.name.as_str())
        .filter(|c| names::check_subdomain(c).is_ok())
        .unwrap_or(&ev.name);
    let mut out = vec![Call::new(
        Component::Allocate,
        Route::Claim {
            ns: ns.clone(),
            name: claim.to_string(),
        },
    )];
    let Some(pool) = spec.our_pool(&ns) else {
        return out;
    };
    out.push(Call::new(Component::Pools, Route::PoolSync(pool)));
    out
}

/// A pool event: the pools step, and the provision step as well for a
/// cloud-backed pool (the object has `spec.metal` or `spec.phoenixnap`;
/// the pools step leaves it alone).
fn pool(ev: &ObjectEvent, kind: PoolKind, ns: String) -> Vec<Call> {
    let id = PoolId::of(kind, &ns, &ev.name);
    let mut out = vec![Call::new(Component::Pools, Route::PoolSync(id.clone()))];
    let backed = ["/spec/metal", "/spec/phoenixnap"]
        .iter()
        .any(|p| pointer(ev, p).is_some_and(Value::is_object));
    if backed {
        out.push(Call::new(Component::Provision, Route::VrfPool(id)));
    }
    out
}

/// What follows a chained call, from its answer: each Machine an expansion
/// step names (valid names only) is synced by its own call; a claim in a
/// VRF-backed pool (`metalAssignment`) goes to the assign step, once per
/// event (`assigned` records it), and a `release` that was `waiting` for
/// it runs once more after it.
pub fn follow_up(done: &Call, answer: &Answer, assigned: &mut bool) -> Vec<Call> {
    let mut out = Vec::new();
    match &done.step {
        Route::ProfileMachines { ns, .. } | Route::PacketMachineMachines { ns, .. } => {
            for m in &answer.machines {
                if names::check_subdomain(m).is_ok() {
                    let step = Route::Machine {
                        ns: ns.clone(),
                        name: m.clone(),
                    };
                    out.push(Call::new(Component::Network, step));
                }
            }
        }
        Route::Claim { ns, name } if answer.metal_assignment && !*assigned => {
            *assigned = true;
            let step = Route::MetalClaim {
                ns: ns.clone(),
                name: name.clone(),
            };
            out.push(Call::new(Component::Assign, step));
            if done.component == Component::Release && answer.result.as_deref() == Some("waiting") {
                out.push(done.clone());
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{parse, Outcome};
    use serde_json::json;

    fn routed(object: Value) -> Vec<(&'static str, String)> {
        let body = json!({"type": "MODIFIED", "object": object}).to_string();
        let Outcome::Object(ev) = parse(Some("application/json"), &|_| None, body.as_bytes())
            .unwrap()
            .outcome
        else {
            panic!("not an object event")
        };
        route_event(&ev)
    }

    /// Issue 17, finding 10: a profile's and a `PacketMachine`'s events
    /// reach the network step (they were ignored), which names the
    /// Machines they concern.
    #[test]
    fn profiles_and_packet_machines_go_to_the_network_step() {
        let profile = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
            "metadata": {"name": "l2", "namespace": "team-a"}, "spec": {}});
        assert_eq!(
            routed(profile),
            [("network", "/v1/capi/network-profiles/team-a/l2".to_string())]
        );
        let pm = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "PacketMachine",
            "metadata": {"name": "pm-1", "namespace": "team-a"}, "spec": {}});
        assert_eq!(
            routed(pm),
            [(
                "network",
                "/v1/capi/packet-machines/team-a/pm-1".to_string()
            )]
        );
    }

    /// Prefix pools' events reach their own routes: the pools step, and
    /// the provision step for a VRF-backed one; an `IPAddress` of one, its
    /// claim and its pool's status.
    #[test]
    fn prefix_pools_and_their_claims_reach_their_routes() {
        let pool = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
            "metadata": {"name": "pods", "namespace": "team-a"}, "spec": {"prefixes": ["fd00::/48"]}});
        assert_eq!(
            routed(pool),
            [("pools", "/v1/capi/prefix-pools/team-a/pods".to_string())]
        );
        let vrf = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalPrefixPool",
            "metadata": {"name": "routed"}, "spec": {"metal": {}}});
        assert_eq!(
            routed(vrf),
            [
                ("pools", "/v1/capi/global-prefix-pools/routed".to_string()),
                (
                    "provision",
                    "/v1/capi/metal/global-prefix-pools/routed".to_string()
                )
            ]
        );
        let address = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
            "metadata": {"name": "n-0", "namespace": "team-a"},
            "spec": {"address": "10.96.0.16", "prefix": 28, "claimRef": {"name": "n-0"},
                "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "GlobalMetalPrefixPool", "name": "routed"}}});
        assert_eq!(
            routed(address),
            [
                ("allocate", "/v1/capi/claims/team-a/n-0".to_string()),
                ("pools", "/v1/capi/global-prefix-pools/routed".to_string())
            ]
        );
    }

    fn claim_call(component: Component) -> Call {
        let step = Route::Claim {
            ns: "ns".into(),
            name: "c".into(),
        };
        Call::new(component, step)
    }

    /// A claim step's answer decides the assign step (once per event) and
    /// a release's second run; an expansion's answer, the Machines synced.
    #[test]
    fn follow_ups_come_from_the_typed_answer() {
        let assign = Call::new(
            Component::Assign,
            Route::MetalClaim {
                ns: "ns".into(),
                name: "c".into(),
            },
        );
        let waiting = Answer::parse(br#"{"result":"waiting","metalAssignment":true}"#);
        let release = claim_call(Component::Release);
        let mut assigned = false;
        assert_eq!(
            follow_up(&release, &waiting, &mut assigned),
            [assign.clone(), release.clone()]
        );
        assert!(assigned);
        assert_eq!(follow_up(&release, &waiting, &mut assigned), []);
        let mut assigned = false;
        let allocate = claim_call(Component::Allocate);
        assert_eq!(follow_up(&allocate, &waiting, &mut assigned), [assign]);
        let plain = Answer::parse(br#"{"result":"bound"}"#);
        assert_eq!(follow_up(&allocate, &plain, &mut false), []);

        let expand = Call::new(
            Component::Network,
            Route::ProfileMachines {
                ns: "ns".into(),
                name: "l2".into(),
            },
        );
        let answer = Answer::parse(br#"{"result":"expanded","machines":["m-1","Bad_Name"]}"#);
        let machine = Route::Machine {
            ns: "ns".into(),
            name: "m-1".into(),
        };
        assert_eq!(
            follow_up(&expand, &answer, &mut false),
            [Call::new(Component::Network, machine)]
        );
    }
}
