//! The network profile rules of the webhook (`MetalNetworkProfile`,
//! reviewed at `POST /v1/admission/network-profiles`).
//!
//! On `CREATE` and `UPDATE` (an unchanged `spec` is allowed as is):
//! 1. the profile must parse and pass
//!    [`Profile::validate`](crate::network::profile::Profile::validate)
//!    (per-port rules: layer2 only on bonds, what may be unbonded, where
//!    VLANs go, native VLANs, references, addresses, routes, MTU); denied
//!    with 422 naming the field;
//! 2. a VLAN named by `pool`, and the pool of an elastic IP, must be a
//!    VRF-backed pool's, in the profile's `metro`: a registered pool
//!    without `spec.metal`, or whose metro is another, is denied with 422
//!    naming the field. A pool not registered
//!    yet is allowed with a warning (pools and profiles may be applied in
//!    any order; the apply step checks again).
//!
//! `DELETE` is always allowed (releasing a machine's networking is the
//! apply step's, on profile removal).

use serde_json::{Map, Value};

use super::{PoolLookup, Reviewed};
use crate::admission::review::Denial;
use crate::error::{Error, Result};
use crate::ipam::pool::{PoolId, PoolKind};
use crate::network::profile::{PoolName, Profile};

/// Reviews a profile write into `out`.
///
/// # Errors
/// 400 when `request.object` is missing; the lookup's errors.
pub(super) fn check_write(
    req: &Map<String, Value>,
    pools: &dyn PoolLookup,
    out: &mut Reviewed,
) -> Result<()> {
    let object = req.get("object").filter(|o| o.is_object()).ok_or_else(|| {
        Error::malformed(format!("request.object is required for {}", out.operation))
            .with_field("request.object")
    })?;
    if out.operation == "UPDATE" {
        let old = req.get("oldObject").and_then(|o| o.get("spec"));
        if old.is_some() && old == object.get("spec") {
            out.outcome = "spec-unchanged";
            return Ok(());
        }
    }
    let namespace = req
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
        })
        .unwrap_or_default()
        .to_string();
    let spec = object
        .get("spec")
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let profile = match Profile::from_json(&spec).and_then(|p| p.validate().map(|_| p)) {
        Ok(p) => p,
        Err(e) => {
            out.deny(Denial::from_error(422, &e));
            return Ok(());
        }
    };
    out.outcome = "allowed";
    for (i, port) in profile.ports.iter().enumerate() {
        let vlan_pools = port.vlans.iter().enumerate().filter_map(|(j, v)| {
            let field = format!("spec.ports[{i}].vlans[{j}].pool");
            v.pool.as_ref().map(|p| (field, p, "its VLAN is"))
        });
        let elastic_pools = port.elastic_ips.iter().enumerate().map(|(k, e)| {
            let field = format!("spec.ports[{i}].elasticIPs[{k}].pool");
            (field, &e.pool, "its elastic IPs are")
        });
        for (field, name, what) in vlan_pools.chain(elastic_pools) {
            let id = pool_id(name, &namespace);
            let Some(pool) = pools.get(&id)? else {
                out.warnings.push(format!(
                    "{field}: pool {} is not registered yet; {what} checked when the profile is applied",
                    id.display()
                ));
                continue;
            };
            let refuse = match (&pool.object.spec.metal, &profile.metro) {
                (None, _) => Some(format!(
                    "pool {} is not VRF-backed (no spec.metal): it has no VLAN and no Metal reservation",
                    id.display()
                )),
                (Some(m), Some(metro)) if !m.metro.eq_ignore_ascii_case(metro) => Some(format!(
                    "the VLAN of pool {} is in metro {}, the profile's is {metro}",
                    id.display(),
                    m.metro
                )),
                _ => None,
            };
            if let Some(msg) = refuse {
                out.deny(Denial::from_error(422, &Error::invalid(field, msg)));
                return Ok(());
            }
        }
    }
    Ok(())
}

fn pool_id(p: &PoolName, namespace: &str) -> PoolId {
    match p.kind.as_deref() {
        Some("GlobalMetalIPPool") => PoolId::global(&p.name),
        _ => PoolId::of(PoolKind::Namespaced, namespace, &p.name),
    }
}
