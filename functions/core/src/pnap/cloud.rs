//! phoenixNAP as a [`Cloud`]: the trait's calls on [`Pnap`]'s, and
//! phoenixNAP's objects as the seam's views (`docs/cloud-seam.md`).
//!
//! - A **server** is a [`DeviceView`]: `powered-on`, `powered-off`,
//!   `rebooting`, `resetting` and `reinstating` are active (addresses can be
//!   put on it); `deleting` is gone, as is a 404. Its provisioned
//!   `privateIpAddresses` and `publicIpAddresses` are its management
//!   addresses.
//! - A server has one [`Nic`], its id the server's: memberships belong to
//!   the server, not a port. The segments it carries are its private and
//!   public networks.
//! - A **private or public network** is a [`Segment`] (`vlanId`, the
//!   location in lower case, as the seam compares them).
//! - Joining or leaving a network is an [`Operation`], one network per call
//!   (no [`Capability::BatchAttach`]); its id is `join:<network>` or
//!   `leave:<network>`, and its state is read from the server: a
//!   membership `in-progress` is `in_progress`, `assigned` is `completed`,
//!   `error` is `failed`; after a leave, no membership is `completed`.
//! - A membership reads `in-progress` both while joining and while
//!   leaving, so the unfinished operation found on a server (a lost
//!   answer's lookup) cannot say which it is: its id is
//!   `change:<network>`, and it is `completed` once the membership is
//!   `assigned` or gone, whichever way it went (the caller re-reads the
//!   server's networks after it, as after any operation).
//! - An **address on a server** is one of the `ips` of a membership
//!   ([`AssignedAddress`] id `<server>/<private|public>/<network>/<ip>`).
//!   [`Cloud::assign_address`] finds the network whose range (private:
//!   `cidr`; public: an attached block) holds the address in the server's
//!   location and joins it with that IP, or adds the IP to the membership
//!   it has; unassigning removes the IP, leaving the network with the last
//!   one. A membership in progress still holds its IPs: unassigning answers
//!   [`CloudError::Unavailable`] after a leave is accepted and while the
//!   membership is in progress, and `false` once the server has left, so
//!   the address is not released (and handed out again) while the server
//!   still holds it. phoenixNAP keeps no labels on a membership: the labels are not
//!   sent, and a lost answer is looked up by address.
//! - **Events**: the audit log names no resource, so an event is a hint
//!   that something changed: [`Cloud::events_after`] answers the events
//!   newer than the cursor (a timestamp) and, when there are any, "cursor
//!   not found", which makes the poll re-read every server it knows (the
//!   servers' state is the truth).
//!
//! - **Refusals**: phoenixNAP refuses a membership write with 400 (an IP
//!   outside the range or used by another server, a server that cannot
//!   change now) or 409 (the membership is changing). At the seam the 400
//!   is a 422, a refusal in the current state that callers re-read before
//!   they believe it (as Metal's 422), and the 409 is
//!   [`CloudError::Unavailable`]: try again once the change is done.
//!
//! phoenixNAP has only [`Capability::ChosenAddresses`]: no NIC modes,
//! bonding, native segments, VRF-backed pools or gateways to create.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

use super::client::Pnap;
use super::model::{Event, NetworkConfiguration, Server};
use crate::cloud::{
    AssignedAddress, Capabilities, Capability, Cloud, CloudError, CloudEvent, CloudResult,
    DeviceAddress, DeviceView, Member, MemberState, Memberships, Nic, Operation, Segment,
};
use crate::ports::http::HttpClient;
use crate::ports::Env;

/// What phoenixNAP can do beyond the seam: choose the addresses a server
/// gets on a network.
pub const CAPABILITIES: Capabilities = Capabilities::of(&[Capability::ChosenAddresses]);

/// Server states in which it runs (or can be powered on) with its networks.
const ACTIVE: [&str; 5] = [
    "powered-on",
    "powered-off",
    "rebooting",
    "resetting",
    "reinstating",
];

/// Which kind of network a membership is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Private,
    Public,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Private => "private",
            Kind::Public => "public",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        match s {
            "private" => Some(Kind::Private),
            "public" => Some(Kind::Public),
            _ => None,
        }
    }
}

/// A server's membership as the seam reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Membership {
    kind: Kind,
    network: String,
    ips: Vec<String>,
    status: Option<String>,
}

fn memberships(net: &NetworkConfiguration) -> Vec<Membership> {
    let private = net
        .private_network_configuration
        .iter()
        .flat_map(|c| &c.private_networks)
        .map(|m| Membership {
            kind: Kind::Private,
            network: m.id.clone(),
            ips: m.ips.clone(),
            status: m.status_description.clone(),
        });
    let public = net
        .public_network_configuration
        .iter()
        .flat_map(|c| &c.public_networks)
        .map(|m| Membership {
            kind: Kind::Public,
            network: m.id.clone(),
            ips: m.ips.clone(),
            status: m.status_description.clone(),
        });
    private.chain(public).collect()
}

impl From<&Server> for DeviceView {
    fn from(s: &Server) -> Self {
        let management = |public: bool| {
            move |a: &String| DeviceAddress {
                address: Some(a.clone()),
                public: Some(public),
                management: Some(true),
                ..DeviceAddress::default()
            }
        };
        let addresses = s
            .private_ip_addresses
            .iter()
            .map(management(false))
            .chain(s.public_ip_addresses.iter().map(management(true)))
            .collect();
        DeviceView {
            id: s.id.clone(),
            state: Some(s.status.clone()),
            active: ACTIVE.contains(&s.status.as_str()),
            gone: s.status == "deleting",
            frozen: false,
            nics: vec![Nic {
                id: s.id.clone(),
                segments: memberships(&s.network_configuration)
                    .into_iter()
                    .map(|m| m.network)
                    .collect(),
                ..Nic::default()
            }],
            addresses,
        }
    }
}

/// The operation id of joining (`attach`) or leaving `network`.
fn operation_id(attach: bool, network: &str) -> String {
    format!("{}:{network}", if attach { "join" } else { "leave" })
}

/// Which way an operation goes, as its id says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Join,
    Leave,
    /// Found unfinished: joining or leaving, phoenixNAP does not say.
    Either,
}

/// The [`AssignedAddress`] id of `ip` on `network` of `server`.
fn address_id(server: &str, kind: Kind, network: &str, ip: &str) -> String {
    format!("{server}/{}/{network}/{ip}", kind.name())
}

/// Seconds a caller waits before trying a membership write phoenixNAP
/// refused because the membership is changing.
pub const MEMBERSHIP_BUSY_S: u64 = 5;

/// phoenixNAP's refusal of a membership write as the seam's: a 400 (an IP
/// outside the range, already used, a server in a state that cannot
/// change) is a refusal in the current state, 422, which callers re-read
/// before they believe it; a 409 (the membership is changing) is "not
/// now", [`CloudError::Unavailable`]. Anything else is as it was.
fn seam_error(e: CloudError) -> CloudError {
    match e {
        CloudError::Api {
            status: 400,
            request,
            messages,
        } => CloudError::Api {
            status: 422,
            request,
            messages,
        },
        CloudError::Api {
            status: 409,
            request,
            messages,
        } => CloudError::Unavailable {
            retry_after_s: MEMBERSHIP_BUSY_S,
            detail: format!("{request}: 409 {}", messages.join("; ")),
        },
        other => other,
    }
}

fn refused(request: &str, message: String) -> CloudError {
    CloudError::Api {
        status: 422,
        request: request.to_owned(),
        messages: vec![message],
    }
}

/// The operation's state from a membership (or its absence).
fn operation_of(id: &str, direction: Direction, member: Option<&Membership>) -> Operation {
    use Direction::{Either, Join, Leave};
    let status = member.map(|m| m.status.as_deref());
    let (state, errors) = match (direction, status) {
        (Join | Either, Some(Some("assigned"))) => ("completed", vec![]),
        (Join | Either, Some(Some("error"))) => (
            "failed",
            vec!["phoenixNAP reports the membership in error".to_owned()],
        ),
        (Join | Either, Some(_)) => ("in_progress", vec![]),
        (Join, None) => (
            "failed",
            vec!["the server is not on the network".to_owned()],
        ),
        (Leave | Either, None) => ("completed", vec![]),
        (Leave, Some(_)) => ("in_progress", vec![]),
    };
    Operation {
        id: id.to_owned(),
        state: Some(state.to_owned()),
        error_messages: errors,
    }
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> Pnap<'_, H, E> {
    /// The network of `kind` in `location` whose range holds `ip`.
    fn network_holding(&self, location: &str, ip: IpAddr) -> CloudResult<Option<(Kind, String)>> {
        let inside = |cidr: &str| cidr.parse::<IpNet>().is_ok_and(|n| n.contains(&ip));
        for n in self.private_networks(Some(location))? {
            if n.cidr.as_deref().is_some_and(inside) {
                return Ok(Some((Kind::Private, n.id)));
            }
        }
        for n in self.public_networks(Some(location))? {
            if n.ip_blocks.iter().any(|b| inside(&b.cidr)) {
                return Ok(Some((Kind::Public, n.id)));
            }
        }
        Ok(None)
    }

    fn join(&self, server: &str, kind: Kind, network: &str, ips: Vec<String>) -> CloudResult<()> {
        let joined = match kind {
            Kind::Private => self
                .join_private_network(
                    server,
                    &super::model::ServerPrivateNetwork {
                        id: network.to_owned(),
                        ips,
                        dhcp: Some(false),
                        status_description: None,
                    },
                )
                .map(drop),
            Kind::Public => self
                .join_public_network(
                    server,
                    &super::model::ServerPublicNetwork {
                        id: network.to_owned(),
                        ips,
                        status_description: None,
                    },
                )
                .map(drop),
        };
        joined.map_err(seam_error)
    }

    fn set_ips(&self, server: &str, kind: Kind, network: &str, ips: &[String]) -> CloudResult<()> {
        match kind {
            Kind::Private => self.update_private_ips(server, network, ips).map(drop),
            Kind::Public => self.update_public_ips(server, network, ips).map(drop),
        }
        .map_err(seam_error)
    }

    fn leave(&self, server: &str, kind: Kind, network: &str) -> CloudResult<bool> {
        match kind {
            Kind::Private => self.leave_private_network(server, network),
            Kind::Public => self.leave_public_network(server, network),
        }
        .map_err(seam_error)
    }
}

fn kind_of(public: bool) -> Kind {
    if public {
        Kind::Public
    } else {
        Kind::Private
    }
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> Memberships for Pnap<'_, H, E> {
    fn members(&self, device: &str) -> CloudResult<Option<Vec<Member>>> {
        let Some(server) = self.server(device)? else {
            return Ok(None);
        };
        let state = |s: Option<&str>| match s {
            Some("assigned") => MemberState::Ready,
            Some("error") => MemberState::Failed,
            _ => MemberState::Changing,
        };
        Ok(Some(
            memberships(&server.network_configuration)
                .into_iter()
                .map(|m| Member {
                    state: state(m.status.as_deref()),
                    public: m.kind == Kind::Public,
                    segment: m.network,
                    addresses: m.ips,
                })
                .collect(),
        ))
    }

    fn join(&self, device: &str, segment: &str, addresses: &[String]) -> CloudResult<()> {
        let kind = if self.private_network(segment)?.is_some() {
            Kind::Private
        } else if self.public_network(segment)?.is_some() {
            Kind::Public
        } else {
            return Err(CloudError::Api {
                status: 404,
                request: format!("join network {segment} with server {device}"),
                messages: vec![format!("no network {segment}")],
            });
        };
        Pnap::join(self, device, kind, segment, addresses.to_vec())
    }

    fn set_addresses(
        &self,
        device: &str,
        segment: &str,
        public: bool,
        addresses: &[String],
    ) -> CloudResult<()> {
        self.set_ips(device, kind_of(public), segment, addresses)
    }

    fn leave(&self, device: &str, segment: &str, public: bool) -> CloudResult<bool> {
        Pnap::leave(self, device, kind_of(public), segment)
    }
}

impl From<Event> for CloudEvent {
    fn from(e: Event) -> Self {
        CloudEvent {
            id: e.timestamp,
            devices: Vec::new(),
        }
    }
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> Cloud for Pnap<'_, H, E> {
    /// phoenixNAP's reasons (`PnapNotFound`, `PnapForbidden`, …).
    fn error(&self, e: CloudError) -> crate::error::Error {
        super::client::pnap_error(e)
    }

    fn name(&self) -> &'static str {
        "phoenixNAP"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn device(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        Ok(self.server(id)?.as_ref().map(DeviceView::from))
    }

    fn device_within(&self, id: &str, budget_ms: u64) -> CloudResult<Option<DeviceView>> {
        self.within(budget_ms, |p| p.device(id))
    }

    fn device_nics(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        self.device(id)
    }

    fn segment(&self, id: &str) -> CloudResult<Option<Segment>> {
        if let Some(n) = self.private_network(id)? {
            return Ok(Some(Segment {
                id: n.id,
                vlan: Some(n.vlan_id),
                location: Some(n.location.to_ascii_lowercase()),
            }));
        }
        Ok(self.public_network(id)?.map(|n| Segment {
            id: n.id,
            vlan: Some(n.vlan_id),
            location: Some(n.location.to_ascii_lowercase()),
        }))
    }

    fn segments(&self, location: &str) -> CloudResult<Vec<Segment>> {
        let location = location.to_ascii_uppercase();
        let private = self.private_networks(Some(&location))?;
        let public = self.public_networks(Some(&location))?;
        let segment = |id: String, vlan: u16, loc: &str| Segment {
            id,
            vlan: Some(vlan),
            location: Some(loc.to_ascii_lowercase()),
        };
        Ok(private
            .into_iter()
            .map(|n| segment(n.id, n.vlan_id, &n.location))
            .chain(
                public
                    .into_iter()
                    .map(|n| segment(n.id, n.vlan_id, &n.location)),
            )
            .collect())
    }

    fn change_segments(
        &self,
        nic: &str,
        attach: bool,
        segments: &[String],
    ) -> CloudResult<Operation> {
        let request = format!(
            "{} networks of server {nic}",
            if attach { "join" } else { "leave" }
        );
        let [network] = segments else {
            return Err(refused(
                &request,
                format!(
                    "phoenixNAP changes one network per call, not {}",
                    segments.len()
                ),
            ));
        };
        let kind = if self.private_network(network)?.is_some() {
            Kind::Private
        } else if self.public_network(network)?.is_some() {
            Kind::Public
        } else {
            return Err(CloudError::Api {
                status: 404,
                request,
                messages: vec![format!("no network {network}")],
            });
        };
        if attach {
            // Without chosen IPs phoenixNAP puts the next available one
            // (private) and refuses an empty list (public).
            self.join(nic, kind, network, Vec::new())?;
        } else {
            self.leave(nic, kind, network)?;
        }
        Ok(Operation {
            id: operation_id(attach, network),
            state: Some("in_progress".into()),
            error_messages: Vec::new(),
        })
    }

    fn operation(&self, nic: &str, id: &str) -> CloudResult<Option<Operation>> {
        let Some((verb, network)) = id.split_once(':') else {
            return Ok(None);
        };
        let direction = match verb {
            "join" => Direction::Join,
            "leave" => Direction::Leave,
            "change" => Direction::Either,
            _ => return Ok(None),
        };
        let Some(server) = self.server(nic)? else {
            return Ok(None);
        };
        let all = memberships(&server.network_configuration);
        let member = all.iter().find(|m| m.network == network);
        Ok(Some(operation_of(id, direction, member)))
    }

    fn unfinished_operation(&self, nic: &str) -> CloudResult<Option<Operation>> {
        let Some(server) = self.server(nic)? else {
            return Ok(None);
        };
        Ok(memberships(&server.network_configuration)
            .iter()
            .find(|m| m.status.as_deref() == Some("in-progress"))
            .map(|m| {
                let id = format!("change:{}", m.network);
                operation_of(&id, Direction::Either, Some(m))
            }))
    }

    fn addresses(&self, device: &str) -> CloudResult<Vec<AssignedAddress>> {
        let Some(server) = self.server(device)? else {
            return Err(CloudError::Api {
                status: 404,
                request: format!("GET server {device}"),
                messages: vec!["no such server".into()],
            });
        };
        Ok(memberships(&server.network_configuration)
            .into_iter()
            .flat_map(|m| {
                let (kind, network) = (m.kind, m.network);
                m.ips
                    .into_iter()
                    .filter(|ip| !ip.contains(" - "))
                    .map(move |ip| AssignedAddress {
                        id: address_id(device, kind, &network, &ip),
                        address: Some(ip),
                    })
            })
            .collect())
    }

    fn assign_address(
        &self,
        device: &str,
        address: &str,
        _labels: Map<String, Value>,
    ) -> CloudResult<AssignedAddress> {
        let request = format!("assign {address} to server {device}");
        let plain = address.split_once('/').map_or(address, |(a, _)| a);
        let ip: IpAddr = plain
            .parse()
            .map_err(|_| refused(&request, format!("{address:?} is not an IP address")))?;
        let Some(server) = self.server(device)? else {
            return Err(CloudError::Api {
                status: 404,
                request,
                messages: vec!["no such server".into()],
            });
        };
        let Some((kind, network)) = self.network_holding(&server.location, ip)? else {
            return Err(refused(
                &request,
                format!(
                    "no private or public network of {} holds {plain}",
                    server.location
                ),
            ));
        };
        let ip = ip.to_string();
        let id = address_id(device, kind, &network, &ip);
        let all = memberships(&server.network_configuration);
        match all.iter().find(|m| m.network == network) {
            Some(m) if m.ips.contains(&ip) => {}
            Some(m) => {
                let mut ips = m.ips.clone();
                ips.push(ip.clone());
                self.set_ips(device, kind, &network, &ips)?;
            }
            None => self.join(device, kind, &network, vec![ip.clone()])?,
        }
        Ok(AssignedAddress {
            id,
            address: Some(ip),
        })
    }

    fn unassign_address(&self, id: &str) -> CloudResult<bool> {
        let mut parts = id.splitn(4, '/');
        let (Some(server), Some(kind), Some(network), Some(ip)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Ok(false);
        };
        let Some(kind) = Kind::parse(kind) else {
            return Ok(false);
        };
        let Some(s) = self.server(server)? else {
            return Ok(false);
        };
        let all = memberships(&s.network_configuration);
        let Some(m) = all.iter().find(|m| m.network == network && m.kind == kind) else {
            return Ok(false);
        };
        if !m.ips.iter().any(|x| x == ip) {
            return Ok(false);
        }
        // A membership in progress (a leave accepted, or a join) still holds
        // its IPs: the address is not free until phoenixNAP is done with it.
        let busy = || CloudError::Unavailable {
            retry_after_s: MEMBERSHIP_BUSY_S,
            detail: format!("server {server} is changing its membership of network {network}"),
        };
        if m.status.as_deref() == Some("in-progress") {
            return Err(busy());
        }
        let rest: Vec<String> = m.ips.iter().filter(|x| *x != ip).cloned().collect();
        if rest.is_empty() {
            // Leaving is asynchronous: asked again, the server is read
            // until it has left (`false` then).
            match self.leave(server, kind, network)? {
                true => Err(busy()),
                false => Ok(false),
            }
        } else {
            self.set_ips(server, kind, network, &rest).map(|()| true)
        }
    }

    fn memberships(&self) -> Option<&dyn Memberships> {
        Some(self)
    }

    fn events_after(
        &self,
        after: Option<&str>,
        _pages: u32,
    ) -> CloudResult<(Vec<CloudEvent>, bool)> {
        let Some(after) = after else {
            // No cursor yet: the newest event becomes it (a resync reads
            // every known server anyway).
            let newest = self.newest_event()?;
            return Ok((newest.into_iter().map(CloudEvent::from).collect(), false));
        };
        // `from` is inclusive: the cursor's own event comes back, and so
        // does any event of the same instant, which the resync the cursor
        // caused covered unless it was written after that poll's read
        // (then the full reconcile covers it).
        let mut events: Vec<CloudEvent> = self
            .events(after)?
            .into_iter()
            .filter(|e| e.timestamp != after)
            .map(CloudEvent::from)
            .collect();
        events.reverse();
        let found = events.is_empty();
        Ok((events, found))
    }
}
