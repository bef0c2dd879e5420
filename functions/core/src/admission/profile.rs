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
//!    cloud-backed pool's, of the profile's cloud and place: a registered
//!    pool without `spec.metal` or `spec.phoenixnap`, one of the other
//!    cloud (a Metal pool in a profile with `spec.location`, a phoenixNAP
//!    one in a profile with `spec.metro`), or in another metro or location
//!    is denied with 422 naming the field. A pool not registered
//!    yet is allowed with a warning (pools and profiles may be applied in
//!    any order; the apply step checks again).
//!
//! On `DELETE`: a profile that Machines of its namespace use (their
//! [`PROFILE_ANNOTATION`](crate::network::profile::PROFILE_ANNOTATION), or
//! their `PacketMachine`'s, names it) is not deleted: denied with 403
//! `ProfileInUse` naming them (up to ten). A profile is not what releases a
//! machine's network (its removal leaves every network as it is, and each
//! Machine then reports `ProfileNotFound`): remove the annotations (or
//! `DELETE /v1/machines/{ns}/{name}/network`) first. The annotation
//! [`SKIP_DELETE_VALIDATION_ANNOTATION`] on the profile (any value; the
//! one the pools take, for `clusterctl move`) lets it be deleted anyway,
//! with a warning. Checking needs the Machines ([`MachineLookup`]: the
//! API server); without them the review fails (500), and the webhook's
//! `failurePolicy: Fail` keeps the profile.

use serde_json::{Map, Value};

use super::{request_object, PoolLookup, Reviewed, SKIP_DELETE_VALIDATION_ANNOTATION};
use crate::admission::review::Denial;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::backing::Backing;
use crate::kube::names;
use crate::network::profile::Profile;

/// Reviews a profile write into `out`.
///
/// # Errors
/// 400 when `request.object` is missing; the lookup's errors.
pub(super) fn check_write(
    req: &Map<String, Value>,
    pools: &dyn PoolLookup,
    out: &mut Reviewed,
) -> Result<()> {
    let object = request_object(req, &out.operation)?;
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
            let id = name.id(&namespace);
            let Some(pool) = pools.get(&id)? else {
                out.warnings.push(format!(
                    "{field}: pool {} is not registered yet; {what} checked when the profile is applied",
                    id.display()
                ));
                continue;
            };
            let elastic = field.contains(".elasticIPs[");
            let refuse = match (pool.object.spec.backing(), &profile.metro, &profile.location) {
                (Some(Backing::Pnap(_)), _, _) if elastic => Some(format!(
                    "pool {} is backed by phoenixNAP: elastic IPs come from a VRF-backed (Metal) pool",
                    id.display()
                )),
                (None, _, _) => Some(format!(
                    "pool {} is not backed by a cloud (no spec.metal or spec.phoenixnap): it has no VLAN or network",
                    id.display()
                )),
                (Some(Backing::Metal(m)), Some(metro), _) if !m.metro.eq_ignore_ascii_case(metro) => {
                    Some(format!(
                        "the VLAN of pool {} is in metro {}, the profile's is {metro}",
                        id.display(),
                        m.metro
                    ))
                }
                (Some(Backing::Metal(_)), None, Some(_)) => Some(format!(
                    "pool {} is backed by Metal (spec.metal); the profile is phoenixNAP's (spec.location)",
                    id.display()
                )),
                (Some(Backing::Pnap(_)), Some(_), _) => Some(format!(
                    "pool {} is backed by phoenixNAP (spec.phoenixnap); the profile is Metal's (spec.metro)",
                    id.display()
                )),
                (Some(Backing::Pnap(p)), None, Some(l)) if p.location != *l => Some(format!(
                    "the network of pool {} is in location {}, the profile's is {l}",
                    id.display(),
                    p.location
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

/// Which Machines use a profile (the API server's Machines, for the
/// webhook).
pub trait MachineLookup {
    /// The Machines of namespace `ns` that use profile `profile`.
    ///
    /// # Errors
    /// The API server's errors; 500 when it is not configured.
    fn using(&self, ns: &str, profile: &str) -> Result<Vec<String>>;
}

/// No Machines can be looked up (the webhook has no Kubernetes access):
/// every profile deletion fails to be reviewed.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMachines;

impl MachineLookup for NoMachines {
    fn using(&self, _: &str, _: &str) -> Result<Vec<String>> {
        Err(Error::new(
            ErrorKind::Internal,
            "KubeNotConfigured",
            "the webhook cannot list Machines (variables k8s_api_url and k8s_token of the admission component): a profile in use would be deleted",
        ))
    }
}

/// At most this many Machines are named in a denial.
const MAX_NAMED: usize = 10;

/// Reviews a profile deletion into `out`.
///
/// # Errors
/// 400 when the request names no profile; the lookup's errors.
pub(super) fn check_delete(
    req: &Map<String, Value>,
    machines: &dyn MachineLookup,
    out: &mut Reviewed,
) -> Result<()> {
    let meta = req
        .get("oldObject")
        .and_then(|o| o.get("metadata"))
        .and_then(Value::as_object);
    let field = |key: &str| {
        req.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .or_else(|| meta.and_then(|m| m.get(key)).and_then(Value::as_str))
            .filter(|s| !s.is_empty())
    };
    let (Some(name), Some(ns)) = (field("name"), field("namespace")) else {
        return Err(Error::malformed(
            "request.name and request.namespace are required for DELETE",
        ));
    };
    if names::check_subdomain(name).is_err() || names::check_label(ns).is_err() {
        // Not a name a Machine could carry: nothing uses it.
        out.outcome = "allowed";
        return Ok(());
    }
    let skip = meta
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(SKIP_DELETE_VALIDATION_ANNOTATION));
    if skip {
        out.outcome = "skip-annotation";
        out.warnings.push(format!(
            "deletion not checked for Machines using the profile: {SKIP_DELETE_VALIDATION_ANNOTATION} is set (their networks stay as they are)"
        ));
        return Ok(());
    }
    let using = machines.using(ns, name)?;
    out.outcome = "allowed";
    if using.is_empty() {
        return Ok(());
    }
    let mut listed: Vec<String> = using
        .iter()
        .take(MAX_NAMED)
        .map(|m| format!("{ns}/{m}"))
        .collect();
    if using.len() > MAX_NAMED {
        listed.push(format!("and {} more", using.len() - MAX_NAMED));
    }
    out.deny(Denial {
        code: 403,
        reason: "ProfileInUse",
        message: format!(
            "MetalNetworkProfile {ns}/{name} is used by Machine(s) {}; remove their {} annotation (or DELETE /v1/machines/<namespace>/<name>/network) first, \
             or annotate the profile {SKIP_DELETE_VALIDATION_ANNOTATION} to delete it anyway (their networks are left as they are)",
            listed.join(", "),
            crate::network::profile::PROFILE_ANNOTATION
        ),
        field: None,
    });
    Ok(())
}
