//! The Metal API client: request building, retries within a budget,
//! pagination, error bodies, and one typed method per call metal-ipam
//! makes, over the [`HttpClient`] port.
//!
//! Every request carries `X-Auth-Token` (never logged: [`MetalConfig`]'s
//! `Debug` redacts it), `Accept: application/json` and, with a body,
//! `Content-Type: application/json`. Retries follow [`super::retry`]:
//! a POST is never repeated after a 5xx or a lost connection
//! ([`MetalError::OutcomeUnknown`]; look the resource up by tag before
//! creating it again). `Deprecation` and `Sunset` headers are collected in
//! [`Metal::notices`] for the request log.

use std::cell::{Cell, RefCell};

use http::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::model::{
    Device, ErrorBody, Event, IpAddress, IpAssignment, IpAssignmentInput, Meta, MetalGateway,
    PortAssignInput, VirtualNetwork, VirtualNetworkCreateInput, VlanBatch, VlanBatchInput, Vrf,
    VrfCreateInput, VrfIpReservation, VrfIpReservationCreateInput, VrfMetalGatewayCreateInput,
};
use super::retry::RetryPolicy;
use crate::cloud::attempts::Attempts;
use crate::cloud::CloudError;
use crate::error::{Error, ErrorKind};
use crate::ports::http::{headers, HttpClient};
use crate::ports::Env;

/// Where the Metal API is, the project, and how to authenticate.
#[derive(Clone, PartialEq, Eq)]
pub struct MetalConfig {
    /// Base URL, e.g. `https://api.equinix.com/metal/v1` (no trailing
    /// slash needed).
    pub base_url: String,
    /// The API token (`X-Auth-Token`). A secret: never logged or returned.
    pub token: String,
    /// The project every project-scoped call uses.
    pub project_id: String,
    /// Retry limits per request.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for MetalConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("project_id", &self.project_id)
            .field("retry", &self.retry)
            .finish()
    }
}

/// The API's base path on its server (`https://api.equinix.com/metal/v1`).
pub const BASE_PATH: &str = "/metal/v1";

/// Page size asked for on paginated lists.
pub const PER_PAGE: u32 = 250;

/// Pages read at most from one paginated list (a guard against a server
/// that never reports its last page).
pub const MAX_PAGES: u32 = 1_000;

/// What went wrong calling Metal: the cloud-neutral [`CloudError`] (its
/// earlier name, kept for the Metal client's callers).
pub type MetalError = CloudError;

impl From<MetalError> for Error {
    fn from(e: MetalError) -> Self {
        let detail = e.to_string();
        let (kind, reason, message) = match &e {
            MetalError::Api { status: 404, .. } => (
                ErrorKind::NotFound,
                "MetalNotFound",
                "a Metal resource does not exist",
            ),
            MetalError::Api {
                status: 401 | 403, ..
            } => (
                ErrorKind::Internal,
                "MetalForbidden",
                "Equinix Metal refused the token or its permissions (metal_token)",
            ),
            MetalError::Api { status: 422, .. } => (
                ErrorKind::Conflict,
                "MetalRefused",
                "Equinix Metal refused the change in the resource's current state",
            ),
            MetalError::Api { status, .. } if *status >= 500 => (
                ErrorKind::Transient,
                "MetalUnavailable",
                "Equinix Metal is unavailable; retry",
            ),
            MetalError::Api { .. } => (
                ErrorKind::Internal,
                "MetalRejected",
                "Equinix Metal rejected a request metal-ipam built",
            ),
            MetalError::Unavailable { .. } => (
                ErrorKind::Transient,
                "MetalUnavailable",
                "Equinix Metal is rate limiting or unavailable; retry",
            ),
            MetalError::OutcomeUnknown { .. } => (
                ErrorKind::Transient,
                "MetalOutcomeUnknown",
                "a Metal request may or may not have taken effect; retry (the step looks before it creates again)",
            ),
            MetalError::Malformed { .. } => (
                ErrorKind::Internal,
                "MetalMalformed",
                "Equinix Metal answered with a body metal-ipam cannot read",
            ),
            MetalError::Tls { .. } => (
                ErrorKind::Internal,
                "MetalTlsFailed",
                "the TLS connection to Equinix Metal failed (certificate not trusted or invalid, or a TLS protocol error): check metal_api_url and the component's client TLS settings; retrying does not help",
            ),
            MetalError::Denied { .. } => (
                ErrorKind::Internal,
                "MetalDenied",
                "the runtime refused the request to Equinix Metal: check metal_api_url and the component's allowed_outbound_hosts",
            ),
        };
        Error::new(kind, reason, message).with_detail(detail)
    }
}

pub use super::retry::MIN_ATTEMPT_MS;
pub use crate::cloud::attempts::{attempt_deadline, CONNECT_MS};

/// The answer to `request`: a 2xx's status and body, else
/// [`MetalError::Api`] with Metal's messages.
fn answer(request: String, resp: http::Response<Vec<u8>>) -> Result<(u16, Vec<u8>), MetalError> {
    let status = resp.status().as_u16();
    let body = resp.into_body();
    if (200..300).contains(&status) {
        return Ok((status, body));
    }
    let messages = serde_json::from_slice::<ErrorBody>(&body)
        .map(|e| e.messages())
        .unwrap_or_default();
    Err(MetalError::Api {
        status,
        request,
        messages,
    })
}

/// Characters escaped in a query value: everything but unreserved ones.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The client: configuration, transport and clock, counting its requests.
pub struct Metal<'a, H: HttpClient + ?Sized, E: Env + ?Sized> {
    http: &'a H,
    cfg: &'a MetalConfig,
    env: &'a E,
    calls: Cell<u32>,
    notices: RefCell<Vec<String>>,
}

impl<'a, H: HttpClient + ?Sized, E: Env + ?Sized> Metal<'a, H, E> {
    /// A client for `cfg` over `http`, waiting and timing with `env`.
    pub fn new(http: &'a H, cfg: &'a MetalConfig, env: &'a E) -> Self {
        Metal {
            http,
            cfg,
            env,
            calls: Cell::new(0),
            notices: RefCell::new(Vec::new()),
        }
    }

    /// HTTP requests sent (retries included).
    pub fn calls(&self) -> u32 {
        self.calls.get()
    }

    /// `Deprecation` / `Sunset` headers seen, each once.
    pub fn notices(&self) -> Vec<String> {
        self.notices.borrow().clone()
    }

    /// The configuration the client uses.
    pub fn config(&self) -> &MetalConfig {
        self.cfg
    }

    /// A client over the same transport and clock with `cfg` instead (the
    /// poll reads devices within a shorter retry budget); its calls and
    /// notices are counted apart.
    pub fn with_config<'b>(&'b self, cfg: &'b MetalConfig) -> Metal<'b, H, E> {
        Metal::new(self.http, cfg, self.env)
    }

    fn url(&self, path: &str, query: &[(&str, String)]) -> String {
        let mut url = format!("{}{path}", self.cfg.base_url.trim_end_matches('/'));
        for (i, (k, v)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(k);
            url.push('=');
            url.extend(utf8_percent_encode(v, QUERY));
        }
        url
    }

    fn note(&self, resp: &http::Response<Vec<u8>>) {
        for name in [headers::DEPRECATION, headers::SUNSET] {
            if let Some(v) = resp.headers().get(&name).and_then(|v| v.to_str().ok()) {
                let n = format!("{name}: {v}");
                let mut notices = self.notices.borrow_mut();
                if !notices.contains(&n) {
                    notices.push(n);
                }
            }
        }
    }

    /// Sends one request with retries; returns the status and body of the
    /// answer (a 2xx, or a 4xx other than 429 as [`MetalError::Api`]).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), MetalError> {
        let request = format!("{method} {path}");
        let repeatable = method != Method::POST;
        let url = self.url(path, query);
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let attempts = Attempts {
            http: self.http,
            env: self.env,
            policy: self.cfg.retry,
            calls: &self.calls,
        };
        let resp = attempts.send(
            &request,
            repeatable,
            || self.request(&method, &url, body.is_some(), &bytes),
            |r| self.note(r),
        )?;
        answer(request, resp)
    }

    /// One attempt's request: the token, JSON headers and `bytes`.
    fn request(
        &self,
        method: &Method,
        url: &str,
        has_body: bool,
        bytes: &[u8],
    ) -> http::Result<http::Request<Vec<u8>>> {
        let mut b = http::Request::builder()
            .method(method.clone())
            .uri(url)
            .header(headers::X_AUTH_TOKEN, &self.cfg.token)
            .header(headers::ACCEPT, "application/json")
            .header(
                headers::USER_AGENT,
                concat!("metal-ipam/", env!("CARGO_PKG_VERSION")),
            );
        if has_body {
            b = b.header(headers::CONTENT_TYPE, "application/json");
        }
        b.body(bytes.to_vec())
    }

    fn json<T: DeserializeOwned>(&self, request: &str, body: &[u8]) -> Result<T, MetalError> {
        serde_json::from_slice(body).map_err(|e| MetalError::Malformed {
            detail: format!("{request}: {e}"),
        })
    }

    /// GETs one resource; `None` on 404.
    fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Option<T>, MetalError> {
        match self.send(Method::GET, path, query, None) {
            Ok((_, body)) => self.json(path, &body).map(Some),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// POSTs `input` and reads the created resource.
    fn create<I: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        input: &I,
    ) -> Result<T, MetalError> {
        let body = serde_json::to_value(input).map_err(|e| MetalError::Malformed {
            detail: format!("POST {path}: {e}"),
        })?;
        let (_, answer) = self.send(Method::POST, path, &[], Some(&body))?;
        self.json(path, &answer)
    }

    /// DELETEs a resource: `true` if this call deleted it (or started
    /// deleting it), `false` if it was already gone (404).
    fn delete(&self, path: &str, query: &[(&str, String)]) -> Result<bool, MetalError> {
        match self.send(Method::DELETE, path, query, None) {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The array under `key` of a list answer, every page of it when the
    /// list is paginated (`meta.last_page`).
    fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        query: &[(&str, String)],
        paginated: bool,
    ) -> Result<Vec<T>, MetalError> {
        let mut out = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut q = query.to_vec();
            if paginated {
                q.push(("page", page.to_string()));
                q.push(("per_page", PER_PAGE.to_string()));
            }
            let (_, body) = self.send(Method::GET, path, &q, None)?;
            let mut v: Value = self.json(path, &body)?;
            let items = v.get_mut(key).map(Value::take).unwrap_or(Value::Null);
            if !items.is_null() {
                let items: Vec<T> =
                    serde_json::from_value(items).map_err(|e| MetalError::Malformed {
                        detail: format!("GET {path}: {key}: {e}"),
                    })?;
                out.extend(items);
            }
            let meta: Meta = v
                .get("meta")
                .and_then(|m| serde_json::from_value(m.clone()).ok())
                .unwrap_or_default();
            if !paginated || !meta.has_next() {
                return Ok(out);
            }
        }
        Err(MetalError::Malformed {
            detail: format!("GET {path}: more than {MAX_PAGES} pages"),
        })
    }

    fn project(&self, rest: &str) -> String {
        format!("/projects/{}{rest}", self.cfg.project_id)
    }

    /// The project's VRFs, in `metro` when given (not paginated).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn list_vrfs(&self, metro: Option<&str>) -> Result<Vec<Vrf>, MetalError> {
        let q: Vec<(&str, String)> = metro
            .map(|m| ("metro", m.to_ascii_lowercase()))
            .into_iter()
            .collect();
        self.list(&self.project("/vrfs"), "vrfs", &q, false)
    }

    /// One VRF; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_vrf(&self, id: &str) -> Result<Option<Vrf>, MetalError> {
        self.get(&format!("/vrfs/{id}"), &[])
    }

    /// Creates a VRF (the metro code lower-cased).
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn create_vrf(&self, input: &VrfCreateInput) -> Result<Vrf, MetalError> {
        let mut input = input.clone();
        input.metro = input.metro.to_ascii_lowercase();
        self.create(&self.project("/vrfs"), &input)
    }

    /// Deletes a VRF; `false` if it was already gone.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn delete_vrf(&self, id: &str) -> Result<bool, MetalError> {
        self.delete(&format!("/vrfs/{id}"), &[])
    }

    /// The project's IP reservations of `types` (e.g. `["vrf"]`; all when
    /// empty), every page.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn list_ips(&self, types: &[&str]) -> Result<Vec<IpAddress>, MetalError> {
        let q: Vec<(&str, String)> = types.iter().map(|t| ("types", t.to_string())).collect();
        self.list(&self.project("/ips"), "ip_addresses", &q, true)
    }

    /// One reservation or assignment; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_ip(&self, id: &str) -> Result<Option<IpAddress>, MetalError> {
        self.get(&format!("/ips/{id}"), &[])
    }

    /// Reserves a VRF block.
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn create_vrf_reservation(
        &self,
        input: &VrfIpReservationCreateInput,
    ) -> Result<VrfIpReservation, MetalError> {
        match self.create(&self.project("/ips"), input)? {
            IpAddress::Vrf(r) => Ok(r),
            other => Err(MetalError::Malformed {
                detail: format!(
                    "POST /ips: a VRF reservation was created, the answer is {other:?}"
                ),
            }),
        }
    }

    /// Deletes a reservation, or unassigns an assignment; `false` if it was
    /// already gone.
    ///
    /// # Errors
    /// See [`MetalError`] (422 while a gateway uses the reservation).
    pub fn delete_ip(&self, id: &str) -> Result<bool, MetalError> {
        self.delete(&format!("/ips/{id}"), &[])
    }

    /// Assigns an address from a reservation to a device.
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn assign_ip(
        &self,
        device_id: &str,
        input: &IpAssignmentInput,
    ) -> Result<IpAssignment, MetalError> {
        self.create(&format!("/devices/{device_id}/ips"), input)
    }

    /// A device's IP assignments.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn device_ips(&self, device_id: &str) -> Result<Vec<IpAssignment>, MetalError> {
        self.list(
            &format!("/devices/{device_id}/ips"),
            "ip_addresses",
            &[],
            false,
        )
    }

    /// The ids of the ports VLAN `id` is assigned to (one read, with its
    /// instances and their ports).
    ///
    /// # Errors
    /// See [`MetalError`]; 404 when the VLAN does not exist.
    pub fn vlan_ports(&self, id: &str) -> Result<Vec<String>, MetalError> {
        let q = [("include", "instances".to_string())];
        let Some(v): Option<VirtualNetwork> = self.get(&format!("/virtual-networks/{id}"), &q)?
        else {
            return Ok(Vec::new());
        };
        Ok(v.instances
            .iter()
            .flat_map(|d| &d.network_ports)
            .filter(|p| p.virtual_networks.iter().any(|r| r.id() == Some(id)))
            .map(|p| p.id.clone())
            .collect())
    }

    /// Unassigns VLAN `vnid` from port `port_id`; `false` when it was not
    /// assigned (Metal's 422 "not assigned", which the caller confirms by
    /// re-reading if it matters).
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn unassign_port(&self, port_id: &str, vnid: &str) -> Result<bool, MetalError> {
        let input = PortAssignInput {
            vnid: vnid.to_string(),
        };
        let body = serde_json::to_value(&input).map_err(|e| MetalError::Malformed {
            detail: format!("POST /ports/{port_id}/unassign: {e}"),
        })?;
        match self.send(
            Method::POST,
            &format!("/ports/{port_id}/unassign"),
            &[],
            Some(&body),
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.says(422, "not assigned") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One device with its ports (`include=network_ports`, each with its
    /// VLANs as links); `None` if it does not exist.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn device_ports(&self, id: &str) -> Result<Option<Device>, MetalError> {
        self.get(
            &format!("/devices/{id}"),
            &[("include", "network_ports".to_string())],
        )
    }

    /// A port mode change: `bond`, `disbond` (`bulk` = both members of a
    /// bond port), `convert/layer-2` or `convert/layer-3`. The answer shows
    /// the port as it was; the change shows on later reads.
    ///
    /// # Errors
    /// See [`MetalError`] (422 for Metal's refusals, including the no-op
    /// traps the caller confirms by re-reading); not repeated after a 5xx
    /// or a lost connection.
    pub fn port_mode(&self, port_id: &str, change: PortChange) -> Result<(), MetalError> {
        let (path, query, body): (String, Vec<(&str, String)>, Option<Value>) = match change {
            PortChange::Bond { bulk } => (
                format!("/ports/{port_id}/bond"),
                vec![("bulk_enable", bulk.to_string())],
                None,
            ),
            PortChange::Disbond { bulk } => (
                format!("/ports/{port_id}/disbond"),
                vec![("bulk_disable", bulk.to_string())],
                None,
            ),
            // The spec requires a body; Metal ignores it (TF sends {}).
            PortChange::ConvertLayer2 => (
                format!("/ports/{port_id}/convert/layer-2"),
                vec![],
                Some(Value::Object(serde_json::Map::new())),
            ),
            // New management addresses, as the Terraform provider asks.
            PortChange::ConvertLayer3 => (
                format!("/ports/{port_id}/convert/layer-3"),
                vec![],
                Some(serde_json::json!({"request_ips": [
                    {"address_family": 4, "public": true},
                    {"address_family": 4, "public": false},
                    {"address_family": 6, "public": true}]})),
            ),
        };
        self.send(Method::POST, &path, &query, body.as_ref())?;
        Ok(())
    }

    /// Starts a VLAN assignment batch on a port (never empty).
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn create_vlan_batch(
        &self,
        port_id: &str,
        input: &VlanBatchInput,
    ) -> Result<VlanBatch, MetalError> {
        self.create(&format!("/ports/{port_id}/vlan-assignments/batches"), input)
    }

    /// One batch; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_vlan_batch(
        &self,
        port_id: &str,
        batch_id: &str,
    ) -> Result<Option<VlanBatch>, MetalError> {
        self.get(
            &format!("/ports/{port_id}/vlan-assignments/batches/{batch_id}"),
            &[],
        )
    }

    /// A port's batches (not paginated).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn list_vlan_batches(&self, port_id: &str) -> Result<Vec<VlanBatch>, MetalError> {
        self.list(
            &format!("/ports/{port_id}/vlan-assignments/batches"),
            "batches",
            &[],
            false,
        )
    }

    /// Sets the port's native VLAN (already assigned).
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn set_native_vlan(&self, port_id: &str, vlan: &str) -> Result<(), MetalError> {
        self.send(
            Method::POST,
            &format!("/ports/{port_id}/native-vlan"),
            &[("vnid", vlan.to_string())],
            None,
        )?;
        Ok(())
    }

    /// Removes the port's native VLAN.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn remove_native_vlan(&self, port_id: &str) -> Result<(), MetalError> {
        self.send(
            Method::DELETE,
            &format!("/ports/{port_id}/native-vlan"),
            &[],
            None,
        )?;
        Ok(())
    }

    /// One device; `None` if it does not exist (deleted).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_device(&self, id: &str) -> Result<Option<Device>, MetalError> {
        self.get(&format!("/devices/{id}"), &[])
    }

    /// The project's VLANs in `metro` (not paginated).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn list_vlans(&self, metro: &str) -> Result<Vec<VirtualNetwork>, MetalError> {
        let q = [("metro", metro.to_ascii_lowercase())];
        self.list(
            &self.project("/virtual-networks"),
            "virtual_networks",
            &q,
            false,
        )
    }

    /// The VLAN numbered `vxlan` in `metro` (a number is unique per project
    /// and metro only, so both are checked).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn find_vlan(&self, vxlan: u16, metro: &str) -> Result<Option<VirtualNetwork>, MetalError> {
        let metro = metro.to_ascii_lowercase();
        Ok(self
            .list_vlans(&metro)?
            .into_iter()
            .find(|v| v.is(vxlan, &metro)))
    }

    /// One VLAN; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_vlan(&self, id: &str) -> Result<Option<VirtualNetwork>, MetalError> {
        self.get(&format!("/virtual-networks/{id}"), &[])
    }

    /// Creates a VLAN (the metro code lower-cased).
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn create_vlan(
        &self,
        input: &VirtualNetworkCreateInput,
    ) -> Result<VirtualNetwork, MetalError> {
        let mut input = input.clone();
        input.metro = input.metro.to_ascii_lowercase();
        self.create(&self.project("/virtual-networks"), &input)
    }

    /// Deletes a VLAN; `false` if it was already gone.
    ///
    /// # Errors
    /// See [`MetalError`] (422 while ports are assigned to it).
    pub fn delete_vlan(&self, id: &str) -> Result<bool, MetalError> {
        self.delete(&format!("/virtual-networks/{id}"), &[])
    }

    /// The project's Metal Gateways, every page.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn list_gateways(&self) -> Result<Vec<MetalGateway>, MetalError> {
        let q = [("include", GATEWAY_INCLUDE.to_string())];
        self.list(&self.project("/metal-gateways"), "metal_gateways", &q, true)
    }

    /// One gateway; `None` if it does not exist. (A deleted gateway may
    /// also answer 403; the teardown treats that as gone.)
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn get_gateway(&self, id: &str) -> Result<Option<MetalGateway>, MetalError> {
        self.get(
            &format!("/metal-gateways/{id}"),
            &[("include", GATEWAY_INCLUDE.to_string())],
        )
    }

    /// Creates a VRF Metal Gateway for a reservation on a VLAN.
    ///
    /// # Errors
    /// See [`MetalError`]; not repeated after a 5xx or a lost connection.
    pub fn create_vrf_gateway(
        &self,
        input: &VrfMetalGatewayCreateInput,
    ) -> Result<MetalGateway, MetalError> {
        self.create(&self.project("/metal-gateways"), input)
    }

    /// Starts deleting a gateway (202; it goes through `deleting`); `false`
    /// if it was already gone.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn delete_gateway(&self, id: &str) -> Result<bool, MetalError> {
        self.delete(
            &format!("/metal-gateways/{id}"),
            &[("include", GATEWAY_INCLUDE.to_string())],
        )
    }

    /// The project's events, newest first, up to `pages` pages.
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn project_events(&self, pages: u32) -> Result<Vec<Event>, MetalError> {
        Ok(self.project_events_after(None, pages)?.0)
    }

    /// The project's events newer than the event `after` (all when
    /// `None`), newest first, reading pages until that event or `pages`
    /// pages; also whether `after` was found (when it was not, older events
    /// may have been missed).
    ///
    /// # Errors
    /// See [`MetalError`].
    pub fn project_events_after(
        &self,
        after: Option<&str>,
        pages: u32,
    ) -> Result<(Vec<Event>, bool), MetalError> {
        let mut out = Vec::new();
        let path = self.project("/events");
        for page in 1..=pages.min(MAX_PAGES) {
            let q = [
                ("page", page.to_string()),
                ("per_page", PER_PAGE.to_string()),
            ];
            let (_, body) = self.send(Method::GET, &path, &q, None)?;
            let list: EventPage = self.json(&path, &body)?;
            for e in list.events {
                if after == Some(e.id.as_str()) {
                    return Ok((out, true));
                }
                out.push(e);
            }
            if !list.meta.has_next() {
                break;
            }
        }
        Ok((out, after.is_none()))
    }
}

/// A port mode change ([`Metal::port_mode`]): the seam's
/// [`ModeChange`](crate::cloud::ModeChange) (`bond`, `disbond` with
/// `bulk_enable`/`bulk_disable` for both members of a bond port,
/// `convert/layer-2`, `convert/layer-3`).
pub type PortChange = crate::cloud::ModeChange;

/// `include` for gateway calls: with these the `oneOf` answer matches one
/// variant only (and the reservation and VLAN come back as objects).
pub const GATEWAY_INCLUDE: &str = "ip_reservation,virtual_network,vrf";

#[derive(serde::Deserialize)]
struct EventPage {
    #[serde(default)]
    events: Vec<Event>,
    #[serde(default)]
    meta: Meta,
}
