//! Pools backed by phoenixNAP: the cloud calls the provisioning driver
//! makes for a pool whose addresses are a phoenixNAP **private network**
//! (its `cidr`) or a **public network** with an **IP block** attached
//! (issue 29). Free functions over the [`Pnap`] client, one resource per
//! call, keeping no state: the driver records each result before the next
//! call, as it does for Metal's resources ([`super::vrf_cloud`]).
//!
//! | Call | Requests |
//! | --- | --- |
//! | [`adopt_network`] | `GET …/{private,public}-networks/{id}`, or `GET …?location=` by VLAN |
//! | [`create_private_network`], [`create_public_network`] | `POST /networks/v1/{private,public}-networks` (the public one with its block in `ipBlocks`) |
//! | [`attach_block`] | `GET /networks/v1/public-networks/{id}`, then `POST …/{id}/ip-blocks` unless attached |
//! | [`adopt_block`], [`block_cidr`] | `GET /ips/v1/ip-blocks/{id}` |
//! | [`create_block`] | `POST /ips/v1/ip-blocks` |
//! | [`find_network`], [`find_block`] | `GET …-networks?location=`, `GET /ips/v1/ip-blocks`; a `DELETE` per duplicate |
//! | [`delete_network`] | `DELETE …-networks/{id}` |
//! | [`delete_block`] | `GET /ips/v1/ip-blocks/{id}`, `DELETE /networks/v1/public-networks/{net}/ip-blocks/{id}` if attached, `DELETE /ips/v1/ip-blocks/{id}` |
//! | [`network_cidr`], [`members`] | `GET …-networks/{id}` |
//! | [`remove_member`] | `DELETE /bmc/v1/servers/{id}/network-configuration/{private,public}-network-configuration/{private,public}-networks/{net}` |
//!
//! **Names.** phoenixNAP networks have no tags: a network created for a
//! pool is known by its name and [`NETWORK_DESCRIPTION`] (so a network
//! someone else named alike is never taken for it), an IP block by its
//! description. The caller
//! passes the pool's tag (`metal-ipam-<ns>-<pool>-<uid8>`); every function
//! that writes or matches a name or description passes it through
//! [`fit_name`] first, so the same tag always gives the same name. Network
//! names must match `^(?=.*[a-zA-Z])([a-zA-Z0-9(). -])+$` and be 1–100
//! characters (`PrivateNetworkCreate.name`, `PublicNetworkCreate.name`); a
//! block's description is at most 250 characters. [`fit_name`] replaces
//! every other character with `-`, puts `metal-ipam-` in front of a tag
//! without a letter, and cuts a longer tag to 91 characters followed by
//! `-` and 8 hex digits of a hash (FNV-1a, 32 bits) of the whole tag, so
//! two long tags with the same beginning still differ. Kubernetes
//! namespaces, names and uids fit as they are.
//!
//! **Lost answers.** The client never repeats a `POST`: a creation whose
//! answer was lost (or a 5xx after it was sent) is a [`CreateError`] with
//! `outcome_unknown`, and the driver looks for the resource
//! ([`find_network`], [`find_block`]) before creating it again. A network
//! name is unique per account, so a creation refused (400 or 409) while a
//! network of that name and metal-ipam's description exists in the
//! location is reported the same way: the earlier creation took effect. Duplicates (which only a creation
//! outliving its intent's lease can leave: blocks, whose descriptions are
//! not unique, or networks if phoenixNAP ever allowed a name twice) are
//! deleted by the `find_` calls, the oldest (`createdOn`, then id) kept.
//!
//! **Asynchronous.** An attached block reads `assigning` until phoenixNAP
//! has put it on the network (servers can take IPs of it only then); a
//! member that leaves reads `in-progress` until it is gone, and a network
//! with any member is not deleted. The driver asks [`members`] again after
//! [`remove_member`] until none is left, as it does for Metal's VLAN ports.
//!
//! **Errors.** phoenixNAP's answers become [`Error`]s with `Pnap…` reasons
//! ([`pnap_error`]); an adopted resource that is missing or does not fit
//! is a 422 naming the `spec.phoenixnap` field; a recorded resource gone
//! from phoenixNAP is a 409 (`PnapNetworkGone`, `PnapBlockGone`).

use std::net::IpAddr;

use ipnet::IpNet;

use super::vrf_cloud::CreateError;
use crate::cloud::CloudError;
use crate::error::{Error, Result};
pub use crate::ipam::pnap::NetworkKind;
pub use crate::pnap::client::pnap_error;
use crate::pnap::client::Pnap;
use crate::pnap::model::{
    IpBlock, IpBlockCreate, NetworkMembership, PrivateNetwork, PrivateNetworkCreate, PublicNetwork,
    PublicNetworkCreate, PublicNetworkIpBlock, PublicNetworkIpBlockCreate,
};
use crate::ports::http::HttpClient;
use crate::ports::Env;

/// The longest network name phoenixNAP accepts (`maxLength`).
pub const NAME_MAX: usize = 100;

/// The description of every network metal-ipam creates: with the name,
/// what identifies it as one metal-ipam created (a network someone else
/// named alike is never taken for it).
pub const NETWORK_DESCRIPTION: &str = "Created by metal-ipam for a pool; deleted with it.";

/// A tag as a name phoenixNAP accepts for a network (and the description
/// of an IP block): see the module docs. Idempotent: a fitted name fits.
///
/// ```
/// use metal_ipam_core::provision::pnap_pools::fit_name;
/// assert_eq!(fit_name("metal-ipam-team-a-pool.b-1a2b3c4d"), "metal-ipam-team-a-pool.b-1a2b3c4d");
/// assert_eq!(fit_name("metal-ipam/pool_a"), "metal-ipam-pool-a");
/// assert_eq!(fit_name("1234"), "metal-ipam-1234");
/// let long = format!("metal-ipam-ns-{}-1a2b3c4d", "p".repeat(120));
/// let name = fit_name(&long);
/// assert_eq!(name.len(), 100);
/// assert_eq!(fit_name(&name), name);
/// assert_ne!(name, fit_name(&format!("metal-ipam-ns-{}-1a2b3c4e", "p".repeat(120))));
/// ```
pub fn fit_name(tag: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '(' | ')' | '.' | ' ' | '-');
    let has_letter = |s: &str| s.chars().any(|c| c.is_ascii_alphabetic());
    let mut name: String = tag
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .collect();
    if !has_letter(&name) {
        name = format!("metal-ipam-{name}");
    }
    if name.len() > NAME_MAX {
        // ASCII only by now: byte offsets are character offsets.
        let cut = NAME_MAX - 9;
        let mut head = name[..cut].to_owned();
        if !has_letter(&head) {
            head = format!("metal-ipam-{}", &name[..cut - "metal-ipam-".len()]);
        }
        name = format!("{head}-{:08x}", fnv1a(tag.as_bytes()));
    }
    name
}

/// FNV-1a, 32 bits.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// A private or public network, as these calls read it.
#[derive(Debug, Clone)]
struct Network {
    id: String,
    name: String,
    description: Option<String>,
    vlan: u16,
    location: String,
    /// A private network's range.
    cidr: Option<String>,
    /// A public network's blocks.
    blocks: Vec<PublicNetworkIpBlock>,
    memberships: Vec<NetworkMembership>,
    created_on: Option<String>,
}

impl Network {
    /// Whether it is the network metal-ipam created under `name` (fitted).
    fn created_as(&self, name: &str) -> bool {
        self.name == name && self.description.as_deref() == Some(NETWORK_DESCRIPTION)
    }
}

impl From<PrivateNetwork> for Network {
    fn from(n: PrivateNetwork) -> Self {
        Network {
            id: n.id,
            name: n.name,
            description: n.description,
            vlan: n.vlan_id,
            location: n.location,
            cidr: n.cidr,
            blocks: Vec::new(),
            memberships: n.memberships,
            created_on: n.created_on,
        }
    }
}

impl From<PublicNetwork> for Network {
    fn from(n: PublicNetwork) -> Self {
        Network {
            id: n.id,
            name: n.name,
            description: n.description,
            vlan: n.vlan_id,
            location: n.location,
            cidr: None,
            blocks: n.ip_blocks,
            memberships: n.memberships,
            created_on: n.created_on,
        }
    }
}

fn read_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    id: &str,
) -> Result<Option<Network>> {
    Ok(match kind {
        NetworkKind::Private => p
            .private_network(id)
            .map_err(pnap_error)?
            .map(Network::from),
        NetworkKind::Public => p.public_network(id).map_err(pnap_error)?.map(Network::from),
    })
}

fn list_networks<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    location: &str,
) -> Result<Vec<Network>> {
    let all: Vec<Network> = match kind {
        NetworkKind::Private => p
            .private_networks(Some(location))
            .map_err(pnap_error)?
            .into_iter()
            .map(Network::from)
            .collect(),
        NetworkKind::Public => p
            .public_networks(Some(location))
            .map_err(pnap_error)?
            .into_iter()
            .map(Network::from)
            .collect(),
    };
    // The query filters already; a server that ignored it must not make
    // another location's network ours.
    Ok(all
        .into_iter()
        .filter(|n| n.location.eq_ignore_ascii_case(location))
        .collect())
}

fn spec_field(kind: NetworkKind, f: &str) -> String {
    format!("spec.phoenixnap.{}.{f}", kind.field())
}

/// The adopted network of `kind` (named in the pool's spec by `id`, or by
/// `vlan` in `location`): it exists, is in `location`, has the VLAN when
/// both are named, and (private) has a range. Its id.
///
/// # Errors
/// 422 `spec.phoenixnap.<field>.id` when the network does not exist (or
/// a private one has no range), `spec.phoenixnap.<field>.vlanId` when no
/// network (or several) of the location has the VLAN or the named one has
/// another, `spec.phoenixnap.location` when it is in another location,
/// `spec.phoenixnap.<field>` when neither is named; phoenixNAP's.
pub fn adopt_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    location: &str,
    id: Option<&str>,
    vlan: Option<u16>,
) -> Result<String> {
    let what = kind.name();
    let net = match (id, vlan) {
        (Some(id), _) => read_network(p, kind, id)?.ok_or_else(|| {
            Error::invalid(
                spec_field(kind, "id"),
                format!("phoenixNAP {what} network {id} does not exist"),
            )
        })?,
        (None, Some(v)) => {
            let mut found: Vec<Network> = list_networks(p, kind, location)?
                .into_iter()
                .filter(|n| n.vlan == v)
                .collect();
            match found.len() {
                1 => found.remove(0),
                0 => {
                    return Err(Error::invalid(
                        spec_field(kind, "vlanId"),
                        format!("no phoenixNAP {what} network with VLAN {v} in {location}"),
                    ))
                }
                n => {
                    return Err(Error::invalid(
                        spec_field(kind, "vlanId"),
                        format!(
                            "{n} phoenixNAP {what} networks have VLAN {v} in {location}: name one by id"
                        ),
                    ))
                }
            }
        }
        (None, None) => {
            return Err(Error::invalid(
                format!("spec.phoenixnap.{}", kind.field()),
                format!("name the {what} network to adopt by id or vlanId"),
            ))
        }
    };
    if !net.location.eq_ignore_ascii_case(location) {
        return Err(Error::invalid(
            "spec.phoenixnap.location",
            format!(
                "phoenixNAP {what} network {} is in {}, not {location}",
                net.id, net.location
            ),
        ));
    }
    if let (Some(_), Some(v)) = (id, vlan) {
        if net.vlan != v {
            return Err(Error::invalid(
                spec_field(kind, "vlanId"),
                format!(
                    "phoenixNAP {what} network {} has VLAN {}, not {v}",
                    net.id, net.vlan
                ),
            ));
        }
    }
    if kind == NetworkKind::Private && net.cidr.is_none() {
        return Err(Error::invalid(
            spec_field(kind, "id"),
            format!(
                "phoenixNAP private network {} has no IP range (cidr) to allocate from",
                net.id
            ),
        ));
    }
    Ok(net.id)
}

/// A creation's failure: unknown when the answer was lost, or when
/// phoenixNAP refused it while a network metal-ipam created under the same
/// name exists in the location (the name is unique: an earlier creation
/// took effect), or when that could not be read.
fn creation_failed<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    location: &str,
    name: &str,
    e: CloudError,
) -> CreateError {
    let outcome_unknown = match &e {
        CloudError::OutcomeUnknown { .. } => true,
        CloudError::Api {
            status: 400 | 409, ..
        } => list_networks(p, kind, location)
            .map_or(true, |all| all.iter().any(|n| n.created_as(name))),
        _ => false,
    };
    CreateError {
        error: pnap_error(e),
        outcome_unknown,
    }
}

fn block_error(e: CloudError) -> CreateError {
    CreateError {
        outcome_unknown: matches!(e, CloudError::OutcomeUnknown { .. }),
        error: pnap_error(e),
    }
}

/// Creates a private network named after `name` ([`fit_name`]) in
/// `location` with range `cidr` (and VLAN `vlan`, else phoenixNAP's
/// choice); its id.
///
/// # Errors
/// [`CreateError`]: phoenixNAP's, `outcome_unknown` when the answer was
/// lost or the name is taken in the location.
pub fn create_private_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    location: &str,
    name: &str,
    cidr: &str,
    vlan: Option<u16>,
) -> std::result::Result<String, CreateError> {
    let name = fit_name(name);
    p.create_private_network(&PrivateNetworkCreate {
        name: name.clone(),
        description: Some(NETWORK_DESCRIPTION.into()),
        location: location.into(),
        vlan_id: vlan,
        cidr: Some(cidr.into()),
    })
    .map(|n| n.id)
    .map_err(|e| creation_failed(p, NetworkKind::Private, location, &name, e))
}

/// Creates a public network named after `name` ([`fit_name`]) in
/// `location` with IP block `block` attached at creation
/// (`PublicNetworkCreate.ipBlocks`); its id.
///
/// # Errors
/// As [`create_private_network`].
pub fn create_public_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    location: &str,
    name: &str,
    vlan: Option<u16>,
    block: &str,
) -> std::result::Result<String, CreateError> {
    let name = fit_name(name);
    p.create_public_network(&PublicNetworkCreate {
        name: name.clone(),
        description: Some(NETWORK_DESCRIPTION.into()),
        location: location.into(),
        vlan_id: vlan,
        ip_blocks: vec![PublicNetworkIpBlockCreate { id: block.into() }],
    })
    .map(|n| n.id)
    .map_err(|e| creation_failed(p, NetworkKind::Public, location, &name, e))
}

/// Attaches IP block `block` to public network `network`: the network is
/// read first, and a block already on it is done (a lost answer of an
/// earlier attach included). A refusal is re-read before it is believed.
///
/// # Errors
/// 409 `PnapNetworkGone` when the network does not exist; phoenixNAP's
/// (409 `PnapRefused`: the block is on another network, in another
/// location, …).
pub fn attach_block<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    network: &str,
    block: &str,
) -> Result<()> {
    let attached = |p: &Pnap<'_, H, E>| -> Result<bool> {
        let net = p
            .public_network(network)
            .map_err(pnap_error)?
            .ok_or_else(|| network_gone(NetworkKind::Public, network))?;
        Ok(net.ip_blocks.iter().any(|b| b.id == block))
    };
    if attached(p)? {
        return Ok(());
    }
    match p.attach_ip_block(network, block) {
        Ok(_) => Ok(()),
        Err(
            e @ CloudError::Api {
                status: 400 | 409, ..
            },
        ) => {
            if attached(p)? {
                Ok(())
            } else {
                Err(pnap_error(e))
            }
        }
        Err(e) => Err(pnap_error(e)),
    }
}

fn network_gone(kind: NetworkKind, id: &str) -> Error {
    Error::conflict(
        "PnapNetworkGone",
        format!("the pool's phoenixNAP {} network {id} is gone", kind.name()),
    )
}

fn block_gone(id: &str) -> Error {
    Error::conflict(
        "PnapBlockGone",
        format!("the pool's phoenixNAP IP block {id} is gone"),
    )
}

/// The adopted IP block `id` (named in the pool's spec): it exists, is in
/// `location` and is not assigned to a server. Its id.
///
/// # Errors
/// 422 `spec.phoenixnap.ipBlock.id` when it does not exist or is on a
/// server, `spec.phoenixnap.location` when it is in another location;
/// phoenixNAP's.
pub fn adopt_block<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    location: &str,
    id: &str,
) -> Result<String> {
    let field = "spec.phoenixnap.ipBlock.id";
    let b = p
        .ip_block(id)
        .map_err(pnap_error)?
        .ok_or_else(|| Error::invalid(field, format!("phoenixNAP IP block {id} does not exist")))?;
    if !b.location.eq_ignore_ascii_case(location) {
        return Err(Error::invalid(
            "spec.phoenixnap.location",
            format!(
                "phoenixNAP IP block {id} is in {}, not {location}",
                b.location
            ),
        ));
    }
    if b.assigned_resource_type.as_deref() == Some("server") {
        return Err(Error::invalid(
            field,
            format!(
                "phoenixNAP IP block {id} is assigned to server {}, not free for a public network",
                b.assigned_resource_id.unwrap_or_default()
            ),
        ));
    }
    Ok(b.id)
}

/// Orders an IPv4 block of `/cidr_block_size` in `location`, its
/// description `description` fitted ([`fit_name`]); its id.
///
/// # Errors
/// [`CreateError`]: phoenixNAP's, `outcome_unknown` when the answer was
/// lost.
pub fn create_block<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    location: &str,
    cidr_block_size: u8,
    description: &str,
) -> std::result::Result<String, CreateError> {
    p.create_ip_block(&IpBlockCreate {
        location: location.into(),
        cidr_block_size: format!("/{cidr_block_size}"),
        description: Some(fit_name(description)),
    })
    .map(|b| b.id)
    .map_err(block_error)
}

/// Unix milliseconds of an RFC 3339 date-time (`Z` or an offset, an
/// optional fraction); `None` if it is not one.
fn created_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = text.get(19..)?;
    let mut ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3: String = frac[..digits].chars().chain("00".chars()).take(3).collect();
        ms = first3.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            sign * (rest.get(1..3)?.parse::<i64>().ok()? * 60
                + rest.get(4..6)?.parse::<i64>().ok()?)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((((days * 24 + h) * 60 + mi - offset_min) * 60 + s) * 1000 + ms)
}

/// The ids of `found` (id, `createdOn`), oldest first: by `createdOn`
/// (one that does not read as a date last), then by id.
fn oldest_first(mut found: Vec<(String, Option<String>)>) -> Vec<String> {
    found.sort_by_cached_key(|(id, created)| {
        (
            created.as_deref().and_then(created_ms).unwrap_or(i64::MAX),
            id.clone(),
        )
    });
    found.into_iter().map(|(id, _)| id).collect()
}

/// The network of `kind` in `location` created for the pool whose tag is
/// `name` (matched fitted, [`fit_name`], with [`NETWORK_DESCRIPTION`]):
/// how a creation whose answer was lost is found. Duplicates are deleted,
/// the oldest kept.
///
/// # Errors
/// phoenixNAP's (a duplicate's deletion included).
pub fn find_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    location: &str,
    name: &str,
) -> Result<Option<String>> {
    let name = fit_name(name);
    let found = list_networks(p, kind, location)?
        .into_iter()
        .filter(|n| n.created_as(&name))
        .map(|n| (n.id, n.created_on))
        .collect();
    let ids = oldest_first(found);
    for extra in ids.iter().skip(1) {
        delete_network(p, kind, extra)?;
    }
    Ok(ids.into_iter().next())
}

/// The IP block in `location` ordered for the pool whose tag is
/// `description` (matched fitted): how an order whose answer was lost is
/// found. Duplicates are deleted ([`delete_block`]), the oldest kept.
///
/// # Errors
/// phoenixNAP's.
pub fn find_block<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    location: &str,
    description: &str,
) -> Result<Option<String>> {
    let description = fit_name(description);
    let found = p
        .ip_blocks()
        .map_err(pnap_error)?
        .into_iter()
        .filter(|b| {
            b.location.eq_ignore_ascii_case(location)
                && b.description.as_deref() == Some(description.as_str())
        })
        .map(|b| (b.id, b.created_on))
        .collect();
    let ids = oldest_first(found);
    for extra in ids.iter().skip(1) {
        delete_block(p, extra)?;
    }
    Ok(ids.into_iter().next())
}

/// Deletes network `id` of `kind`; `false` when it was already gone.
/// phoenixNAP refuses while the network has members (any state): take
/// them off first ([`members`], [`remove_member`]). A public network's
/// blocks are freed, not deleted.
///
/// # Errors
/// 409 `PnapRefused` while it has members; phoenixNAP's.
pub fn delete_network<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    id: &str,
) -> Result<bool> {
    match kind {
        NetworkKind::Private => p.delete_private_network(id),
        NetworkKind::Public => p.delete_public_network(id),
    }
    .map_err(pnap_error)
}

/// Deletes IP block `id`; `false` when it was already gone. A block
/// assigned to a public network is detached from it first (phoenixNAP
/// deletes only unassigned blocks; it refuses the detach while members
/// hold IPs of the block).
///
/// # Errors
/// 409 `PnapBlockOnServer` for a block assigned to a server; 409
/// `PnapRefused` (members hold its IPs, still unassigning); phoenixNAP's.
pub fn delete_block<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    id: &str,
) -> Result<bool> {
    let Some(b): Option<IpBlock> = p.ip_block(id).map_err(pnap_error)? else {
        return Ok(false);
    };
    if let Some(on) = &b.assigned_resource_id {
        if b.assigned_resource_type.as_deref() == Some("server") {
            return Err(Error::conflict(
                "PnapBlockOnServer",
                format!("phoenixNAP IP block {id} is assigned to server {on}: metal-ipam does not take it off"),
            ));
        }
        p.detach_ip_block(on, id).map_err(pnap_error)?;
    }
    p.delete_ip_block(id).map_err(pnap_error)
}

fn parse_cidr(what: &str, cidr: &str) -> Result<(IpAddr, u8)> {
    let net: IpNet = cidr
        .parse()
        .map_err(|_| Error::internal(format!("{what} has the range {cidr:?}, not a CIDR")))?;
    Ok((net.network(), net.prefix_len()))
}

/// The range of network `id`: a private network's `cidr`; a public
/// network's first attached block. Network address and prefix length.
///
/// # Errors
/// 409 `PnapNetworkGone` when it does not exist; 409 `PnapNoRange` for a
/// private network without a range or a public one without a block;
/// phoenixNAP's.
pub fn network_cidr<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    id: &str,
) -> Result<(IpAddr, u8)> {
    let net = read_network(p, kind, id)?.ok_or_else(|| network_gone(kind, id))?;
    let what = format!("phoenixNAP {} network {id}", kind.name());
    let cidr = match kind {
        NetworkKind::Private => net.cidr,
        NetworkKind::Public => net.blocks.into_iter().next().map(|b| b.cidr),
    };
    let cidr = cidr.ok_or_else(|| {
        Error::conflict(
            "PnapNoRange",
            format!("{what} has no IP range (a private cidr or a public IP block)"),
        )
    })?;
    parse_cidr(&what, &cidr)
}

/// The CIDR of IP block `id`: network address and prefix length.
///
/// # Errors
/// 409 `PnapBlockGone` when it does not exist; phoenixNAP's.
pub fn block_cidr<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    id: &str,
) -> Result<(IpAddr, u8)> {
    let b = p
        .ip_block(id)
        .map_err(pnap_error)?
        .ok_or_else(|| block_gone(id))?;
    parse_cidr(&format!("phoenixNAP IP block {id}"), &b.cidr)
}

/// The servers that are members of network `id` (in any state, joining
/// and leaving included); none when the network is gone. Members that are
/// not servers (`storage`, `virtual`) are not listed: metal-ipam puts none
/// there, and the network's deletion names them if any.
///
/// # Errors
/// phoenixNAP's.
pub fn members<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    id: &str,
) -> Result<Vec<String>> {
    Ok(read_network(p, kind, id)?
        .map(|n| {
            n.memberships
                .into_iter()
                .filter(|m| m.resource_type == "server")
                .map(|m| m.resource_id)
                .collect()
        })
        .unwrap_or_default())
}

/// Takes `server` off `network` of `kind` (asynchronous: it stays a
/// member, `in-progress`, until phoenixNAP is done); a server gone or not
/// a member is done.
///
/// # Errors
/// 503 `PnapUnavailable` while its membership is changing (phoenixNAP's
/// 409: try again once it is done, as at the seam); phoenixNAP's (409
/// `PnapRefused`: a server whose networks cannot change now).
pub fn remove_member<H: HttpClient + ?Sized, E: Env + ?Sized>(
    p: &Pnap<'_, H, E>,
    kind: NetworkKind,
    server: &str,
    network: &str,
) -> Result<()> {
    match kind {
        NetworkKind::Private => p.leave_private_network(server, network),
        NetworkKind::Public => p.leave_public_network(server, network),
    }
    .map(drop)
    .map_err(|e| match e {
        CloudError::Api {
            status: 409,
            request,
            messages,
        } => pnap_error(CloudError::Unavailable {
            retry_after_s: crate::pnap::cloud::MEMBERSHIP_BUSY_S,
            detail: format!("{request}: 409 {}", messages.join("; ")),
        }),
        other => pnap_error(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_on_orders_by_instant_not_by_text() {
        let a = created_ms("2025-01-01T00:00:30Z").unwrap();
        let b = created_ms("2025-01-01T00:00:30.491Z").unwrap();
        let c = created_ms("2025-01-01T01:00:30.5+01:00").unwrap();
        assert_eq!(b - a, 491);
        assert_eq!(c - a, 500);
        assert_eq!(created_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(created_ms("soon"), None);
        let ids = oldest_first(vec![
            ("c".into(), Some("2025-01-01T00:00:30Z".into())),
            ("b".into(), Some("2025-01-01T00:00:30.491Z".into())),
            ("a".into(), None),
            ("d".into(), Some("2025-01-01T00:00:30.000Z".into())),
        ]);
        assert_eq!(ids, ["c", "d", "b", "a"]);
    }

    #[test]
    fn fitted_names_match_the_spec_s_pattern() {
        for tag in [
            "metal-ipam-default-pool-1a2b3c4d",
            "metal-ipam.dev/pool-uid=0f0e",
            "ünïcödé_name",
            "0123",
            &"9".repeat(300),
            &format!("{}a", "1".repeat(300)),
        ] {
            let name = fit_name(tag);
            assert!(!name.is_empty() && name.len() <= NAME_MAX, "{name}");
            assert!(name.chars().any(|c| c.is_ascii_alphabetic()), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "(). -".contains(c)),
                "{name}"
            );
            assert_eq!(fit_name(&name), name);
        }
    }
}
