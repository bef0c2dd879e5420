//! Routing: which step components an event is forwarded to, by service
//! chaining, and on which paths. The `events` component
//! ([`crate::http::components::events`]) sends the requests; this decides
//! them from the parsed event alone.

use serde_json::Value;

use super::{Action, ObjectEvent, ObjectKind};
use crate::ipam::claim::IpAddressSpec;
use crate::ipam::pool::{PoolId, PoolKind};
use crate::kube::names;

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
    let ns = ev.namespace.as_deref().unwrap_or("");
    // The object is a hint (it may be stale or forged; the steps re-read
    // it): only the fields routing needs are read. (Reading its whole
    // metadata as `kube::object::ObjectMeta` would cost this component
    // 6.4 KB of wasm for one timestamp.)
    match ev.kind {
        ObjectKind::Claim => {
            let deleting = ev.action == Action::Delete
                || ev
                    .object
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/deletionTimestamp"))
                    .is_some_and(|v| !v.is_null());
            vec![(
                if deleting { "release" } else { "allocate" },
                format!("/v1/capi/claims/{ns}/{}", ev.name),
            )]
        }
        ObjectKind::IpAddress => {
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
            let mut out = vec![("allocate", format!("/v1/capi/claims/{ns}/{claim}"))];
            match spec.our_pool(ns) {
                Some(PoolId {
                    namespace: Some(pns),
                    name,
                    ..
                }) => out.push(("pools", format!("/v1/capi/pools/{pns}/{name}"))),
                Some(PoolId { name, .. }) => {
                    out.push(("pools", format!("/v1/capi/global-pools/{name}")))
                }
                None => {}
            }
            out
        }
        // A Machine's network profile: applied, or released once removed
        // (the step re-reads the Machine; a deleted one needs nothing).
        ObjectKind::Machine => vec![(
            "network",
            format!("/v1/capi/machines/{ns}/{}/network", ev.name),
        )],
        // The Machines it concerns are listed by the network step (the
        // event may be a Reference-mode one, or the object stale).
        ObjectKind::NetworkProfile => vec![(
            "network",
            format!("/v1/capi/network-profiles/{ns}/{}", ev.name),
        )],
        ObjectKind::PacketMachine => vec![(
            "network",
            format!("/v1/capi/packet-machines/{ns}/{}", ev.name),
        )],
        ObjectKind::Pool(kind) => {
            let tail = match kind {
                PoolKind::Namespaced => format!("pools/{ns}/{}", ev.name),
                PoolKind::Global => format!("global-pools/{}", ev.name),
            };
            let mut out = vec![("pools", format!("/v1/capi/{tail}"))];
            // A VRF-backed pool is synced by the provision step (the pools
            // step leaves it alone).
            let vrf_backed = ev
                .object
                .as_ref()
                .and_then(|o| o.pointer("/spec/metal"))
                .is_some_and(Value::is_object);
            if vrf_backed {
                out.push(("provision", format!("/v1/capi/metal/{tail}")));
            }
            out
        }
    }
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
}
