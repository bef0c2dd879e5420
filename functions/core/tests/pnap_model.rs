//! The phoenixNAP model (`pnap::model`) against the vendored specifications
//! (`tests/fixtures/phoenixnap-openapi/`): every answer type reads an
//! object built from its schema's own examples, with the fields metal-ipam
//! uses filled (so a misspelt field name fails here, not against the
//! cloud), and every body metal-ipam sends uses only its schema's
//! properties, the required ones included.

use std::path::PathBuf;

use metal_ipam_core::pnap::model::{
    Event, IpBlock, IpBlockCreate, PrivateNetwork, PrivateNetworkCreate, PublicNetwork,
    PublicNetworkCreate, PublicNetworkIpBlockCreate, Server, ServerPrivateNetwork,
    ServerPublicNetwork,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

fn spec(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/phoenixnap-openapi")
        .join(format!("{name}.spec.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_norway::from_str(&text).unwrap()
}

fn schema<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec.pointer(&format!("/components/schemas/{name}"))
        .unwrap_or_else(|| panic!("no schema {name}"))
}

/// An instance of `schema` from its examples: every property, recursively.
fn example(spec: &Value, schema: &Value) -> Value {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = spec.pointer(r.trim_start_matches('#')).unwrap();
        return example(spec, target);
    }
    if let Some(parts) = schema.get("allOf").and_then(Value::as_array) {
        let mut out = Map::new();
        for p in parts {
            if let Value::Object(o) = example(spec, p) {
                out.extend(o);
            }
        }
        return Value::Object(out);
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        return Value::Object(
            props
                .iter()
                .map(|(k, v)| (k.clone(), example(spec, v)))
                .collect(),
        );
    }
    if schema.get("type").and_then(Value::as_str) == Some("array") {
        // Arrays of objects from their item schema (every field); arrays of
        // scalars from the array's own example when it has one.
        let items = &schema["items"];
        let scalar = items.get("$ref").is_none() && items.get("properties").is_none();
        if let Some(e) = schema.get("example").filter(|e| scalar && e.is_array()) {
            if e.as_array().is_some_and(|a| !a.is_empty()) {
                return e.clone();
            }
        }
        return Value::Array(vec![example(spec, items)]);
    }
    if let Some(e) = schema.get("example") {
        return e.clone();
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") | Some("number") => Value::from(10),
        Some("boolean") => Value::Bool(true),
        _ => Value::String("x".into()),
    }
}

fn read<T: DeserializeOwned>(spec_name: &str, schema_name: &str) -> T {
    let spec = spec(spec_name);
    let obj = example(&spec, schema(&spec, schema_name));
    serde_json::from_value(obj.clone())
        .unwrap_or_else(|e| panic!("{schema_name} from its examples ({obj}): {e}"))
}

/// `body`'s fields are properties of the schema, and every required one is there.
fn sends(spec_name: &str, schema_name: &str, body: Value) {
    let spec = spec(spec_name);
    let s = schema(&spec, schema_name);
    let props = s["properties"].as_object().unwrap();
    let body = body.as_object().unwrap();
    for k in body.keys() {
        assert!(props.contains_key(k), "{schema_name} has no property {k}");
    }
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        assert!(
            body.contains_key(r.as_str().unwrap()),
            "{schema_name} requires {r}"
        );
    }
}

#[test]
fn answers_read_every_field_metal_ipam_uses() {
    let n: PrivateNetwork = read("networkapi", "PrivateNetwork");
    assert!(n.cidr.is_some() && n.vlan_id > 0 && !n.location.is_empty());
    assert!(!n.memberships.is_empty() && !n.memberships[0].ips.is_empty());
    assert!(!n.memberships[0].resource_id.is_empty());

    let p: PublicNetwork = read("networkapi", "PublicNetwork");
    assert!(!p.ip_blocks.is_empty() && !p.ip_blocks[0].cidr.is_empty());
    assert!(!p.memberships.is_empty());

    let b: IpBlock = read("ipapi", "IpBlock");
    assert!(b.assigned_resource_id.is_some() && b.description.is_some());
    assert!(b.cidr_block_size.starts_with('/'));

    let s: Server = read("bmcapi", "Server");
    let net = &s.network_configuration;
    assert!(net.gateway_address.is_some());
    let private = net.private_network_configuration.as_ref().unwrap();
    assert!(private.configuration_type.is_some());
    let member = &private.private_networks[0];
    assert!(!member.ips.is_empty() && member.status_description.is_some());
    let public = net.public_network_configuration.as_ref().unwrap();
    assert!(public.public_networks[0].status_description.is_some());
    assert!(!s.private_ip_addresses.is_empty() && !s.public_ip_addresses.is_empty());

    let e: Event = read("auditapi", "Event");
    assert!(e.name.is_some() && !e.timestamp.is_empty());
}

#[test]
fn bodies_use_only_their_schema_s_properties() {
    sends(
        "networkapi",
        "PrivateNetworkCreate",
        serde_json::to_value(PrivateNetworkCreate {
            name: "metal-ipam team-a pool-a".into(),
            description: Some("d".into()),
            location: "PHX".into(),
            vlan_id: Some(10),
            cidr: Some("10.0.0.0/24".into()),
        })
        .unwrap(),
    );
    sends(
        "networkapi",
        "PublicNetworkCreate",
        serde_json::to_value(PublicNetworkCreate {
            name: "n".into(),
            description: None,
            location: "PHX".into(),
            vlan_id: Some(10),
            ip_blocks: vec![PublicNetworkIpBlockCreate { id: "b".into() }],
        })
        .unwrap(),
    );
    sends(
        "networkapi",
        "PublicNetworkIpBlockCreate",
        serde_json::to_value(PublicNetworkIpBlockCreate { id: "b".into() }).unwrap(),
    );
    sends(
        "ipapi",
        "IpBlockCreate",
        serde_json::to_value(IpBlockCreate {
            location: "PHX".into(),
            cidr_block_size: "/29".into(),
            description: Some("metal-ipam".into()),
        })
        .unwrap(),
    );
    let join = ServerPrivateNetwork {
        id: "n".into(),
        ips: vec!["10.0.0.5".into()],
        dhcp: Some(false),
        status_description: Some("assigned".into()),
    };
    let body = serde_json::to_value(&join).unwrap();
    assert!(
        body.get("statusDescription").is_none(),
        "read-only, not sent"
    );
    sends("bmcapi", "ServerPrivateNetwork", body);
    let join = ServerPublicNetwork {
        id: "n".into(),
        ips: vec!["198.51.100.5".into()],
        status_description: None,
    };
    sends(
        "bmcapi",
        "ServerPublicNetwork",
        serde_json::to_value(&join).unwrap(),
    );
}
