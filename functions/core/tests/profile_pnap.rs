//! A `MetalNetworkProfile` checked for a phoenixNAP server
//! (`Profile::validate_for(CloudKind::Phoenixnap)`, and `validate` for a
//! profile with `spec.location`): each of phoenixNAP's rules refused with a
//! 422 naming the field, one rule at a time, and the profiles it accepts.

use metal_ipam_core::cloud::CloudKind;
use metal_ipam_core::network::profile::Profile;
use serde_json::{json, Value};

const NET: &str = "60473a6115e34466c9f8f083";

fn profile(spec: Value) -> Profile {
    Profile::from_json(&spec).unwrap_or_else(|e| panic!("{spec}: {e:?}"))
}

/// A profile phoenixNAP accepts, with one port entry replaced by `port`.
fn with_port(port: Value) -> Value {
    json!({"location": "PHX", "ports": [port]})
}

#[test]
fn each_phoenixnap_rule_is_a_422_naming_its_field() {
    let vlan = |v: Value| with_port(json!({"name": "bond0", "vlans": [v]}));
    let cases: Vec<(Value, &str, &str)> = vec![
        // A Metal profile on a phoenixNAP server (checked when applied).
        (
            json!({"metro": "da", "ports": []}),
            "spec.metro",
            "spec.location",
        ),
        (
            json!({"location": "phx", "ports": []}),
            "spec.location",
            "three capital letters",
        ),
        (
            json!({"location": "PHXX", "ports": []}),
            "spec.location",
            "three capital letters",
        ),
        (
            with_port(json!({"name": "eth1"})),
            "spec.ports[0].name",
            "bond0",
        ),
        (
            json!({"location": "PHX", "ports": [{"name": "bond0"}, {"name": "bond0"}]}),
            "spec.ports[1].name",
            "twice",
        ),
        (
            with_port(json!({"name": "bond0", "bonded": false})),
            "spec.ports[0].bonded",
            "no bonds",
        ),
        (
            with_port(json!({"name": "bond0", "layer2": true})),
            "spec.ports[0].layer2",
            "no port modes",
        ),
        (
            with_port(json!({"name": "bond0", "nativeVLAN": {"vxlan": 210}})),
            "spec.ports[0].nativeVLAN",
            "tagged",
        ),
        (
            with_port(json!({"name": "bond0", "elasticIPs": [{"pool": {"name": "pub"}}]})),
            "spec.ports[0].elasticIPs",
            "vlans[].addresses",
        ),
        // A Metal VLAN uuid is not a phoenixNAP network id.
        (
            vlan(json!({"id": "3b0f6a56-3a2c-4c1c-9a52-4a1d3a0a2b11"})),
            "spec.ports[0].vlans[0].id",
            "24 lower-case hex digits",
        ),
        (
            vlan(json!({"id": NET.to_ascii_uppercase()})),
            "spec.ports[0].vlans[0].id",
            "24 lower-case hex digits",
        ),
        (
            vlan(json!({"id": "60473a6115e34466c9f8f08"})),
            "spec.ports[0].vlans[0].id",
            "24 lower-case hex digits",
        ),
        // phoenixNAP's VLAN ids go to 4094 (Metal's to 3999), from 2.
        (
            vlan(json!({"vxlan": 4095})),
            "spec.ports[0].vlans[0].vxlan",
            "2–4094",
        ),
        (
            vlan(json!({"vxlan": 1})),
            "spec.ports[0].vlans[0].vxlan",
            "2–4094",
        ),
        (
            vlan(json!({"id": NET, "vxlan": 210})),
            "spec.ports[0].vlans[0]",
            "exactly one way",
        ),
        (
            vlan(json!({"pool": {"name": "p", "kind": "MetalPrefixPool"}})),
            "spec.ports[0].vlans[0].pool.kind",
            "sub-prefixes",
        ),
    ];
    for (spec, field, says) in cases {
        let p = profile(spec.clone());
        for (how, got) in [
            ("validate_for", p.validate_for(CloudKind::Phoenixnap)),
            ("validate", p.validate()),
        ] {
            // `validate` takes phoenixNAP's rules from `spec.location`.
            if how == "validate" && p.location.is_none() {
                continue;
            }
            let e = got.expect_err(&format!("{how}: {spec} accepted"));
            assert_eq!(
                (e.status(), e.field()),
                (422, Some(field)),
                "{how}: {spec}: {e:?}"
            );
            assert!(
                e.to_string().contains(says),
                "{how}: {spec}: {e} does not say {says:?}"
            );
        }
    }
}

#[test]
fn a_profile_naming_both_clouds_is_refused() {
    let p = profile(json!({"metro": "da", "location": "PHX", "ports": []}));
    for got in [
        p.validate(),
        p.validate_for(CloudKind::Phoenixnap),
        p.validate_for(CloudKind::Metal),
    ] {
        let e = got.unwrap_err();
        assert_eq!(e.status(), 422, "{e:?}");
        assert!(
            matches!(e.field(), Some("spec.location" | "spec.metro")),
            "{e:?}"
        );
    }
}

#[test]
fn a_vxlan_without_a_location_needs_one() {
    let p = profile(json!({"ports": [{"name": "bond0", "vlans": [{"vxlan": 210}]}]}));
    let e = p.validate_for(CloudKind::Phoenixnap).unwrap_err();
    assert_eq!(e.field(), Some("spec.ports[0].vlans[0].vxlan"), "{e:?}");
    assert!(e.to_string().contains("spec.location"), "{e}");
}

#[test]
fn accepted_profiles_on_phoenixnap_and_location_refused_on_metal() {
    let ok = [
        json!({"location": "PHX", "ports": []}),
        json!({"location": "ASH", "ports": [{"name": "bond0", "bonded": true, "layer2": false}]}),
        json!({"location": "PHX", "ports": [{"name": "bond0", "vlans": [
            {"pool": {"name": "nodes-phx"}, "addresses": [{"pool": {"name": "nodes-phx"}}]},
            {"id": NET, "addresses": [{"static": "10.40.0.5/24"}],
             "routes": [{"to": "10.50.0.0/16", "via": "10.40.0.1"}]},
            {"vxlan": 4094},
            {"vxlan": 2}]}]}),
        // No location: checked as phoenixNAP's only when the server is.
        json!({"ports": [{"name": "bond0", "vlans": [{"id": NET}]}]}),
    ];
    for spec in ok {
        let p = profile(spec.clone());
        p.validate_for(CloudKind::Phoenixnap)
            .unwrap_or_else(|e| panic!("{spec}: {e:?}"));
        if p.location.is_some() {
            p.validate().unwrap_or_else(|e| panic!("{spec}: {e:?}"));
            let e = p.validate_for(CloudKind::Metal).unwrap_err();
            assert_eq!(e.field(), Some("spec.location"), "{spec}: {e:?}");
        }
    }
}
