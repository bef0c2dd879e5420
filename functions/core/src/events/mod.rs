//! Events that forwarders `POST` to `/v1/events`, parsed into one shape.
//!
//! Kubernetes does not call metal-ipam; an event forwarder watches the
//! objects and posts what it sees. [`parse`] accepts the payloads of the
//! forwarders that can deliver whole objects and turns each into an
//! [`ObjectEvent`] ("this object was created/updated" or "…was deleted"), an
//! [`Outcome::Ignored`] with a reason, or a 400 error.
//!
//! # Accepted formats
//!
//! A request is read as exactly one of the following, tried in this order.
//!
//! ## 1. CloudEvents, structured mode (Knative ApiServerSource via a Broker)
//! `Content-Type: application/cloudevents+json` (parameters such as
//! `charset` are ignored; the media type is compared case-insensitively).
//! The body is one JSON object holding the attributes and the data:
//! ```json
//! {"specversion": "1.0", "type": "dev.knative.apiserver.resource.update",
//!  "source": "https://10.96.0.1:443", "id": "6f0c…", "subject": "/apis/…",
//!  "datacontenttype": "application/json",
//!  "kind": "IPAddressClaim", "apiversion": "ipam.cluster.x-k8s.io/v1beta2",
//!  "name": "m-0", "namespace": "team-a", "metalipamtoken": "…",
//!  "data": { …the object… }}
//! ```
//! - `specversion` (must be `"1.0"`), `type`, `id` and `source` are
//!   required non-empty strings;
//! - the data is `data` (a JSON value) or `data_base64` (standard base64 of
//!   the JSON bytes), never both;
//! - batched CloudEvents (`application/cloudevents-batch+json`) are refused
//!   with a 400.
//!
//! A body that carries a `specversion` member but arrives with another
//! content type (or none) is read the same way.
//!
//! ## 2. CloudEvents, binary mode (Knative ApiServerSource straight to us)
//! Any other content type with a `ce-specversion` header. Attributes are the
//! headers `ce-specversion` (`1.0`), `ce-type`, `ce-id`, `ce-source` (all
//! required), `ce-subject`, and the extensions `ce-kind`, `ce-apiversion`,
//! `ce-name`, `ce-namespace`, `ce-metalipamtoken`; header values are
//! percent-decoded as the CloudEvents HTTP binding says. The body is the
//! data, parsed as JSON whatever the content type says.
//!
//! ## CloudEvent types (both modes)
//! | `type` | data | [`Action`] |
//! |---|---|---|
//! | `dev.knative.apiserver.resource.add`, `.update` | the object (Resource mode) | [`Action::Upsert`] |
//! | `dev.knative.apiserver.resource.delete` | the object's last state | [`Action::Delete`] |
//! | `dev.knative.apiserver.ref.add`, `.update` | `{"apiVersion","kind","name","namespace"}` (Reference mode) | [`Action::Upsert`] |
//! | `dev.knative.apiserver.ref.delete` | same | [`Action::Delete`] |
//!
//! Any other type is ignored (its data is not looked at). An event of these
//! types without data is a 400. In Reference mode [`ObjectEvent::object`] is
//! `None`: the caller fetches the object, or treats the event as "reconcile
//! this name". The identity (kind, apiVersion, name, namespace) is read from
//! the data; the `kind`, `apiversion`, `name` and `namespace` extension
//! attributes are not needed, but when present and non-empty they must
//! agree with the data (400 otherwise).
//!
//! **Token.** Knative ApiServerSource cannot add HTTP headers, so the events
//! route also accepts the bearer token as the CloudEvents extension attribute
//! `metalipamtoken` (set it with `spec.ceOverrides.extensions`): the
//! `ce-metalipamtoken` header in binary mode, the `metalipamtoken` member in
//! structured mode. It is returned in [`Parsed::token`] (redacted from
//! `Debug`); [`presented_token`] reads it without parsing the rest, so the
//! caller can authenticate before reporting a malformed event.
//!
//! ## 3. Plain JSON: Kubernetes watch events and Argo Events
//! Anything else must be a JSON object with a string `type` and the object
//! under `object` or `body` (exactly one of them):
//! ```json
//! {"type": "ADDED", "object": { …the object… }}
//! {"type": "UPDATE", "body": { …new object… }, "oldBody": { … },
//!  "group": "ipam.cluster.x-k8s.io", "version": "v1beta2", "resource": "ipaddressclaims"}
//! ```
//! `type` is compared case-insensitively:
//! - Kubernetes watch vocabulary ([`Format::Watch`]): `ADDED`, `MODIFIED` →
//!   [`Action::Upsert`]; `DELETED` → [`Action::Delete`]; `BOOKMARK` and
//!   `ERROR` are ignored (their object is not looked at);
//! - Argo Events `resource` vocabulary ([`Format::ArgoEvents`]): `ADD`,
//!   `UPDATE` → [`Action::Upsert`]; `DELETE` → [`Action::Delete`]. This is
//!   both Argo's own event data (`body`, `oldBody`, `group`, `version`,
//!   `resource`) and the shape an Argo Sensor HTTP trigger should build
//!   (`type` from the event's `type`, the object under `object` or `body`);
//! - any other type is ignored.
//!
//! `oldBody`, `oldObject`, `group`, `version`, `resource` and any other
//! member are not used. There is no token in this format (an Argo Sensor can
//! send an `Authorization` header).
//!
//! # Objects handled
//! An object (formats 1–3 in Resource mode) needs string `apiVersion` and
//! `kind`, and, if its kind is handled, `metadata.name` (and
//! `metadata.namespace` for namespaced kinds). Kinds are matched by the
//! group of `apiVersion` and the exact kind; the version is not checked:
//!
//! | Group | Kind | [`ObjectKind`] | Scope |
//! |---|---|---|---|
//! | `ipam.cluster.x-k8s.io` | `IPAddressClaim` | [`ObjectKind::Claim`] | namespaced |
//! | `ipam.cluster.x-k8s.io` | `IPAddress` | [`ObjectKind::IpAddress`] | namespaced |
//! | `ipam.metal-ipam.dev` | `MetalIPPool` | [`ObjectKind::Pool`]`(Namespaced)` | namespaced |
//! | `ipam.metal-ipam.dev` | `GlobalMetalIPPool` | [`ObjectKind::Pool`]`(Global)` | cluster |
//! | `cluster.x-k8s.io` | `Machine` | [`ObjectKind::Machine`] | namespaced |
//! | `ipam.metal-ipam.dev` | `MetalNetworkProfile` | [`ObjectKind::NetworkProfile`] | namespaced |
//! | `infrastructure.cluster.x-k8s.io` | `PacketMachine` | [`ObjectKind::PacketMachine`] | namespaced |
//!
//! Every other kind is ignored. Names must be DNS-1123 subdomains and
//! namespaces DNS-1123 labels; a namespaced kind without a namespace, or a
//! `GlobalMetalIPPool` with one, is a 400.
//!
//! # Errors
//! Every refusal is a 400: `MalformedJSON` when the body (or decoded
//! `data_base64`) is not JSON, `MalformedEvent` otherwise, naming the member
//! at fault in [`Error::field`] where there is one. Bodies over
//! [`crate::MAX_BODY`] are refused too.

pub mod chain;
pub mod route;

use std::fmt;

use serde_json::{Map, Value};

use crate::error::{Error, ErrorKind, Result};
use crate::ipam::claim::CAPI_IPAM_GROUP;

/// The Cluster API core group (`Machine`).
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// The Cluster API infrastructure group (CAPP's `PacketMachine`).
pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
use crate::ipam::pool::{self, PoolKind};
use crate::kube::names;

/// Media type of a structured-mode CloudEvent.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// Media type of batched CloudEvents (refused).
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";
/// The CloudEvents extension attribute carrying the bearer token.
pub const TOKEN_ATTRIBUTE: &str = "metalipamtoken";
/// The binary-mode header carrying [`TOKEN_ATTRIBUTE`].
pub const TOKEN_HEADER: &str = "ce-metalipamtoken";
/// CloudEvents type prefix of Knative ApiServerSource in Resource mode.
pub const KNATIVE_RESOURCE_TYPE_PREFIX: &str = "dev.knative.apiserver.resource.";
/// CloudEvents type prefix of Knative ApiServerSource in Reference mode.
pub const KNATIVE_REF_TYPE_PREFIX: &str = "dev.knative.apiserver.ref.";

/// The kinds of object an event can be about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// `ipam.cluster.x-k8s.io` `IPAddressClaim`.
    Claim,
    /// `ipam.cluster.x-k8s.io` `IPAddress`.
    IpAddress,
    /// A pool: one of ours (`ipam.metal-ipam.dev`), or one of the
    /// in-cluster provider's (`ipam.cluster.x-k8s.io`, served during a
    /// takeover).
    Pool(PoolKind),
    /// `cluster.x-k8s.io` `Machine` (its network profile).
    Machine,
    /// `ipam.metal-ipam.dev` `MetalNetworkProfile` (the Machines using it).
    NetworkProfile,
    /// `infrastructure.cluster.x-k8s.io` `PacketMachine` (its Machine).
    PacketMachine,
}

impl ObjectKind {
    /// The Kubernetes kind name.
    pub fn kind_name(self) -> &'static str {
        match self {
            ObjectKind::Claim => "IPAddressClaim",
            ObjectKind::IpAddress => "IPAddress",
            ObjectKind::Pool(k) => k.kind_name(),
            ObjectKind::Machine => "Machine",
            ObjectKind::NetworkProfile => crate::network::profile::KIND,
            ObjectKind::PacketMachine => "PacketMachine",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, ObjectKind::Pool(k) if k.is_global())
    }

    /// Classifies an `apiVersion` and `kind` (see the module docs).
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::events::ObjectKind;
    /// use metal_ipam_core::ipam::pool::PoolKind;
    /// assert_eq!(ObjectKind::classify("ipam.cluster.x-k8s.io/v1alpha1", "IPAddress"), Some(ObjectKind::IpAddress));
    /// assert_eq!(ObjectKind::classify("ipam.metal-ipam.dev/v1alpha1", "GlobalMetalIPPool"),
    ///     Some(ObjectKind::Pool(PoolKind::Global)));
    /// assert_eq!(ObjectKind::classify("cluster.x-k8s.io/v1beta2", "Machine"), Some(ObjectKind::Machine));
    /// assert_eq!(ObjectKind::classify("ipam.metal-ipam.dev/v1alpha1", "MetalNetworkProfile"),
    ///     Some(ObjectKind::NetworkProfile));
    /// assert_eq!(ObjectKind::classify("infrastructure.cluster.x-k8s.io/v1beta1", "PacketMachine"),
    ///     Some(ObjectKind::PacketMachine));
    /// assert_eq!(ObjectKind::classify("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool"),
    ///     Some(ObjectKind::Pool(PoolKind::InCluster)));
    /// assert_eq!(ObjectKind::classify("v1", "ConfigMap"), None);
    /// ```
    pub fn classify(api_version: &str, kind: &str) -> Option<ObjectKind> {
        let group = api_version.split_once('/').map_or("", |(g, _)| g);
        match (group, kind) {
            (CAPI_IPAM_GROUP, "IPAddressClaim") => Some(ObjectKind::Claim),
            (CAPI_IPAM_GROUP, "IPAddress") => Some(ObjectKind::IpAddress),
            // The in-cluster provider's pools share the CAPI IPAM group.
            (CAPI_IPAM_GROUP, k) => PoolKind::of_group(CAPI_IPAM_GROUP, k).map(ObjectKind::Pool),
            (pool::GROUP, crate::network::profile::KIND) => Some(ObjectKind::NetworkProfile),
            (pool::GROUP, k) => PoolKind::of_group(pool::GROUP, k).map(ObjectKind::Pool),
            (CAPI_GROUP, "Machine") => Some(ObjectKind::Machine),
            (INFRA_GROUP, "PacketMachine") => Some(ObjectKind::PacketMachine),
            _ => None,
        }
    }
}

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Created or updated: reconcile it.
    Upsert,
    /// Deleted.
    Delete,
}

/// Which payload format an event came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// CloudEvents binary mode (`ce-*` headers, the data as the body).
    KnativeBinary,
    /// CloudEvents structured mode (`application/cloudevents+json`).
    KnativeStructured,
    /// Argo Events `resource` vocabulary (`ADD`, `UPDATE`, `DELETE`).
    ArgoEvents,
    /// Kubernetes watch vocabulary (`ADDED`, `MODIFIED`, `DELETED`, …).
    Watch,
}

impl Format {
    /// A short name for logs: `knative-binary`, `knative-structured`,
    /// `argo-events`, `watch`.
    pub fn name(self) -> &'static str {
        match self {
            Format::KnativeBinary => "knative-binary",
            Format::KnativeStructured => "knative-structured",
            Format::ArgoEvents => "argo-events",
            Format::Watch => "watch",
        }
    }
}

/// An event about an object we handle.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectEvent {
    /// The object's kind.
    pub kind: ObjectKind,
    /// Created/updated or deleted.
    pub action: Action,
    /// Namespace (`None` only for a `GlobalMetalIPPool`), a valid DNS-1123 label.
    pub namespace: Option<String>,
    /// Name, a valid DNS-1123 subdomain.
    pub name: String,
    /// The object's `apiVersion`, e.g. `ipam.cluster.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// The whole object; `None` for Knative Reference-mode events.
    pub object: Option<Value>,
    /// The payload format.
    pub format: Format,
    /// The CloudEvent `id`, for CloudEvents.
    pub id: Option<String>,
}

impl ObjectEvent {
    /// `namespace/name`, or `name` for a cluster-scoped object (for logs).
    pub fn display(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// What a well-formed event amounts to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An event about an object we handle.
    Object(ObjectEvent),
    /// A well-formed event we do not act on; answer 2xx and log the reason.
    Ignored {
        /// The payload format.
        format: Format,
        /// Why, e.g. `CloudEvent type "dev.knative.apiserver.heartbeat" is not handled`.
        reason: String,
    },
}

/// The result of [`parse`]: the outcome and the token the event carried.
#[derive(Clone, PartialEq)]
pub struct Parsed {
    /// The event, or why it is ignored.
    pub outcome: Outcome,
    /// The `metalipamtoken` CloudEvents extension, if present. A credential:
    /// never log it (the `Debug` output shows `<redacted>`).
    pub token: Option<String>,
}

impl fmt::Debug for Parsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parsed")
            .field("outcome", &self.outcome)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn bad(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Malformed, "MalformedEvent", message)
}

fn bad_json(what: &str, e: &serde_json::Error) -> Error {
    Error::new(
        ErrorKind::Malformed,
        "MalformedJSON",
        format!("{what} is not valid JSON: {e}"),
    )
}

fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Parses one event posted to `/v1/events` (formats in the module docs).
///
/// `content_type` is the request's `Content-Type`; `header` looks up a
/// request header by its lower-case name; `body` is the request body.
///
/// # Errors
/// 400 `MalformedJSON` or `MalformedEvent` (see the module docs).
///
/// # Examples
/// ```
/// use metal_ipam_core::events::{parse, Action, ObjectKind, Outcome};
/// let body = br#"{"type": "DELETED", "object": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
///     "kind": "IPAddressClaim", "metadata": {"name": "m-0", "namespace": "team-a", "uid": "u1"}}}"#;
/// let parsed = parse(Some("application/json"), &|_| None, body).unwrap();
/// let Outcome::Object(ev) = parsed.outcome else { panic!() };
/// assert_eq!((ev.kind, ev.action), (ObjectKind::Claim, Action::Delete));
/// assert_eq!(ev.display(), "team-a/m-0");
///
/// // Knative binary mode: attributes in headers, the object as the body.
/// let headers = |h: &str| match h {
///     "ce-specversion" => Some("1.0".to_string()),
///     "ce-type" => Some("dev.knative.apiserver.ref.add".to_string()),
///     "ce-id" => Some("1".to_string()),
///     "ce-source" => Some("https://10.96.0.1:443".to_string()),
///     "ce-metalipamtoken" => Some("s3cret".to_string()),
///     _ => None,
/// };
/// let body = br#"{"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool", "name": "edge"}"#;
/// let parsed = parse(Some("application/json"), &headers, body).unwrap();
/// assert_eq!(parsed.token.as_deref(), Some("s3cret"));
/// let Outcome::Object(ev) = parsed.outcome else { panic!() };
/// assert_eq!((ev.name.as_str(), ev.object), ("edge", None));
///
/// // Malformed JSON is a 400.
/// assert_eq!(parse(None, &|_| None, b"{").unwrap_err().status(), 400);
/// ```
pub fn parse(
    content_type: Option<&str>,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Result<Parsed> {
    if body.len() > crate::MAX_BODY {
        return Err(bad(format!(
            "the body is larger than {} bytes",
            crate::MAX_BODY
        )));
    }
    match content_type.map(media_type).as_deref() {
        Some(STRUCTURED_CONTENT_TYPE) => structured(&json_object(body, "the body")?),
        Some(BATCH_CONTENT_TYPE) => Err(bad(
            "batched CloudEvents are not accepted; send one event per request",
        )),
        _ if header("ce-specversion").is_some() => binary(header, body),
        _ => {
            let obj = json_object(body, "the body")?;
            if obj.contains_key("specversion") {
                structured(&obj)
            } else {
                plain(&obj)
            }
        }
    }
}

/// The `metalipamtoken` the request carries, read without validating the
/// rest of the event, so the caller can authenticate before parsing: the
/// `ce-metalipamtoken` header (binary mode), or the `metalipamtoken` member
/// of a structured-mode body. `None` when absent or unreadable.
///
/// # Examples
/// ```
/// use metal_ipam_core::events::presented_token;
/// let body = br#"{"specversion": "1.0", "metalipamtoken": "s3cret"}"#;
/// assert_eq!(presented_token(Some("application/cloudevents+json"), &|_| None, body).as_deref(), Some("s3cret"));
/// assert_eq!(presented_token(Some("application/json"), &|_| None, b"{}"), None);
/// ```
pub fn presented_token(
    content_type: Option<&str>,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Option<String> {
    let structured_type = content_type.map(media_type).as_deref() == Some(STRUCTURED_CONTENT_TYPE);
    if !structured_type && header("ce-specversion").is_some() {
        return header(TOKEN_HEADER).and_then(|v| percent_decode(v.trim(), TOKEN_HEADER).ok());
    }
    if body.len() > crate::MAX_BODY {
        return None;
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object()?;
    if !structured_type && !obj.contains_key("specversion") {
        return None;
    }
    obj.get(TOKEN_ATTRIBUTE)
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn json_object(bytes: &[u8], what: &str) -> Result<Map<String, Value>> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(bad(format!("{what} is empty; a JSON object is required")));
    }
    match serde_json::from_slice(bytes).map_err(|e| bad_json(what, &e))? {
        Value::Object(m) => Ok(m),
        _ => Err(bad(format!("{what} must be a JSON object"))),
    }
}

/// CloudEvent attributes we read, from headers or the structured body.
struct Attrs {
    specversion: Option<String>,
    type_: Option<String>,
    id: Option<String>,
    source: Option<String>,
    kind: Option<String>,
    apiversion: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
    token: Option<String>,
}

impl Attrs {
    /// The attributes we use, each read with `get` (from `ce-*` headers in
    /// binary mode, from the JSON object in structured mode).
    fn read(get: impl Fn(&str) -> Result<Option<String>>) -> Result<Attrs> {
        Ok(Attrs {
            specversion: get("specversion")?,
            type_: get("type")?,
            id: get("id")?,
            source: get("source")?,
            kind: get("kind")?,
            apiversion: get("apiversion")?,
            name: get("name")?,
            namespace: get("namespace")?,
            token: get(TOKEN_ATTRIBUTE)?,
        })
    }
}

fn binary(header: &dyn Fn(&str) -> Option<String>, body: &[u8]) -> Result<Parsed> {
    let get = |attr: &str| -> Result<Option<String>> {
        let name = format!("ce-{attr}");
        header(&name)
            .map(|v| percent_decode(v.trim(), &name))
            .transpose()
    };
    let attrs = Attrs::read(get)?;
    let data = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(serde_json::from_slice(body).map_err(|e| bad_json("the event data (body)", &e))?)
    };
    cloud_event(attrs, data, Format::KnativeBinary, "ce-")
}

fn structured(obj: &Map<String, Value>) -> Result<Parsed> {
    let get = |attr: &str| -> Result<Option<String>> {
        match obj.get(attr) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("attribute {attr} must be a string")).with_field(attr)),
        }
    };
    let attrs = Attrs::read(get)?;
    let data = match (obj.get("data"), obj.get("data_base64")) {
        (Some(_), Some(_)) => {
            return Err(bad("a CloudEvent carries data or data_base64, not both"));
        }
        (Some(Value::Null), None) | (None, None) => None,
        (Some(d), None) => Some(d.clone()),
        (None, Some(Value::String(s))) => {
            let bytes = base64_decode(s)
                .ok_or_else(|| bad("data_base64 is not valid base64").with_field("data_base64"))?;
            Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| bad_json("the decoded data_base64", &e))?,
            )
        }
        (None, Some(_)) => {
            return Err(bad("data_base64 must be a string").with_field("data_base64"));
        }
    };
    cloud_event(attrs, data, Format::KnativeStructured, "")
}

/// Knative ApiServerSource mode, from the type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Resource,
    Reference,
}

fn cloud_event(attrs: Attrs, data: Option<Value>, format: Format, prefix: &str) -> Result<Parsed> {
    let required = |v: &Option<String>, attr: &str| -> Result<String> {
        v.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
            bad(format!(
                "the CloudEvent has no {prefix}{attr}; specversion, type, id and source are required"
            ))
            .with_field(format!("{prefix}{attr}"))
        })
    };
    let specversion = required(&attrs.specversion, "specversion")?;
    if specversion != "1.0" {
        return Err(bad(format!(
            "CloudEvents specversion {specversion:?} is not supported; use \"1.0\""
        ))
        .with_field(format!("{prefix}specversion")));
    }
    let type_ = required(&attrs.type_, "type")?;
    let id = required(&attrs.id, "id")?;
    required(&attrs.source, "source")?;
    let token = attrs.token.clone();
    let (mode, action) = match knative_type(&type_) {
        Some(m) => m,
        None => {
            return Ok(Parsed {
                outcome: Outcome::Ignored {
                    format,
                    reason: format!("CloudEvent type {type_:?} is not handled"),
                },
                token,
            })
        }
    };
    let data = data.ok_or_else(|| {
        bad(format!("the CloudEvent of type {type_:?} has no data")).with_field("data")
    })?;
    let outcome = match mode {
        Mode::Resource => from_object(&data, "data", action, format, Some(id))?,
        Mode::Reference => from_reference(&data, action, format, Some(id))?,
    };
    if let Outcome::Object(ev) = &outcome {
        let checks = [
            ("kind", &attrs.kind, Some(ev.kind.kind_name())),
            (
                "apiversion",
                &attrs.apiversion,
                Some(ev.api_version.as_str()),
            ),
            ("name", &attrs.name, Some(ev.name.as_str())),
            ("namespace", &attrs.namespace, ev.namespace.as_deref()),
        ];
        for (attr, given, want) in checks {
            if let Some(g) = given.as_deref().filter(|g| !g.is_empty()) {
                if Some(g) != want {
                    return Err(bad(format!(
                        "extension attribute {prefix}{attr} is {g:?} but the data says {:?}",
                        want.unwrap_or("")
                    ))
                    .with_field(format!("{prefix}{attr}")));
                }
            }
        }
    }
    Ok(Parsed { outcome, token })
}

fn knative_type(t: &str) -> Option<(Mode, Action)> {
    let (mode, op) = if let Some(op) = t.strip_prefix(KNATIVE_RESOURCE_TYPE_PREFIX) {
        (Mode::Resource, op)
    } else {
        (Mode::Reference, t.strip_prefix(KNATIVE_REF_TYPE_PREFIX)?)
    };
    match op {
        "add" | "update" => Some((mode, Action::Upsert)),
        "delete" => Some((mode, Action::Delete)),
        _ => None,
    }
}

fn plain(obj: &Map<String, Value>) -> Result<Parsed> {
    let type_ = match obj.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("type must be a string").with_field("type")),
        None => {
            return Err(bad(
                "the body is neither a CloudEvent (no ce-specversion header, no specversion) \
                 nor a watch/Argo event (no type)",
            )
            .with_field("type"))
        }
    };
    let upper = type_.to_ascii_uppercase();
    let (format, action) = match upper.as_str() {
        "ADDED" | "MODIFIED" => (Format::Watch, Some(Action::Upsert)),
        "DELETED" => (Format::Watch, Some(Action::Delete)),
        "BOOKMARK" | "ERROR" => (Format::Watch, None),
        "ADD" | "UPDATE" => (Format::ArgoEvents, Some(Action::Upsert)),
        "DELETE" => (Format::ArgoEvents, Some(Action::Delete)),
        _ => {
            let format = if obj.contains_key("body") {
                Format::ArgoEvents
            } else {
                Format::Watch
            };
            (format, None)
        }
    };
    let Some(action) = action else {
        return Ok(Parsed {
            outcome: Outcome::Ignored {
                format,
                reason: format!("event type {type_:?} is not handled"),
            },
            token: None,
        });
    };
    let (member, object) = match (obj.get("object"), obj.get("body")) {
        (Some(_), Some(_)) => {
            return Err(bad("the event has both object and body; send one"));
        }
        (Some(o), None) => ("object", o),
        (None, Some(b)) => ("body", b),
        (None, None) => {
            return Err(bad(format!(
                "the {type_} event has no object (expected under \"object\" or \"body\")"
            ))
            .with_field("object"))
        }
    };
    Ok(Parsed {
        outcome: from_object(object, member, action, format, None)?,
        token: None,
    })
}

fn str_member<'a>(m: &'a Map<String, Value>, key: &str, path: &str) -> Result<Option<&'a str>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(format!("{path} must be a string")).with_field(path)),
    }
}

fn from_object(
    object: &Value,
    path: &str,
    action: Action,
    format: Format,
    id: Option<String>,
) -> Result<Outcome> {
    let o = object
        .as_object()
        .ok_or_else(|| bad(format!("{path} must be a Kubernetes object")).with_field(path))?;
    let api_version =
        str_member(o, "apiVersion", &format!("{path}.apiVersion"))?.ok_or_else(|| {
            bad(format!("{path}.apiVersion is required")).with_field(format!("{path}.apiVersion"))
        })?;
    let kind_name = str_member(o, "kind", &format!("{path}.kind"))?.ok_or_else(|| {
        bad(format!("{path}.kind is required")).with_field(format!("{path}.kind"))
    })?;
    let Some(kind) = ObjectKind::classify(api_version, kind_name) else {
        return Ok(not_handled(format, api_version, kind_name));
    };
    let meta_path = format!("{path}.metadata");
    let meta = o
        .get("metadata")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(format!("{meta_path} is required")).with_field(&meta_path))?;
    let name = str_member(meta, "name", &format!("{meta_path}.name"))?;
    let namespace = str_member(meta, "namespace", &format!("{meta_path}.namespace"))?;
    let (namespace, name) = identity(kind, namespace, name, &meta_path)?;
    Ok(Outcome::Object(ObjectEvent {
        kind,
        action,
        namespace,
        name,
        api_version: api_version.to_string(),
        object: Some(object.clone()),
        format,
        id,
    }))
}

fn from_reference(
    data: &Value,
    action: Action,
    format: Format,
    id: Option<String>,
) -> Result<Outcome> {
    let o = data.as_object().ok_or_else(|| {
        bad("Reference-mode data must be {\"apiVersion\",\"kind\",\"name\",\"namespace\"}")
            .with_field("data")
    })?;
    let api_version = str_member(o, "apiVersion", "data.apiVersion")?
        .ok_or_else(|| bad("data.apiVersion is required").with_field("data.apiVersion"))?;
    let kind_name = str_member(o, "kind", "data.kind")?
        .ok_or_else(|| bad("data.kind is required").with_field("data.kind"))?;
    let Some(kind) = ObjectKind::classify(api_version, kind_name) else {
        return Ok(not_handled(format, api_version, kind_name));
    };
    let name = str_member(o, "name", "data.name")?;
    let namespace = str_member(o, "namespace", "data.namespace")?;
    let (namespace, name) = identity(kind, namespace, name, "data")?;
    Ok(Outcome::Object(ObjectEvent {
        kind,
        action,
        namespace,
        name,
        api_version: api_version.to_string(),
        object: None,
        format,
        id,
    }))
}

fn not_handled(format: Format, api_version: &str, kind: &str) -> Outcome {
    Outcome::Ignored {
        format,
        reason: format!("{kind} of {api_version} is not handled"),
    }
}

/// Checks name and namespace of an object of `kind`; `path` is where they
/// were found (`data.metadata`, `object.metadata`, `data`).
fn identity(
    kind: ObjectKind,
    namespace: Option<&str>,
    name: Option<&str>,
    path: &str,
) -> Result<(Option<String>, String)> {
    let name_path = format!("{path}.name");
    let ns_path = format!("{path}.namespace");
    let name = name.ok_or_else(|| {
        bad(format!("{name_path} is required for {}", kind.kind_name())).with_field(&name_path)
    })?;
    names::check_subdomain(name)
        .map_err(|m| bad(format!("invalid {name_path}: {m}")).with_field(&name_path))?;
    let namespace = match (kind.is_namespaced(), namespace) {
        (true, None) => {
            return Err(bad(format!(
                "{ns_path} is required for {}, which is namespaced",
                kind.kind_name()
            ))
            .with_field(ns_path))
        }
        (true, Some(ns)) => {
            names::check_label(ns)
                .map_err(|m| bad(format!("invalid {ns_path}: {m}")).with_field(&ns_path))?;
            Some(ns.to_string())
        }
        (false, Some(ns)) => {
            return Err(bad(format!(
                "{ns_path} is {ns:?} but {} is cluster-scoped",
                kind.kind_name()
            ))
            .with_field(ns_path))
        }
        (false, None) => None,
    };
    Ok((namespace, name.to_string()))
}

/// Decodes `%XX` escapes (CloudEvents HTTP binding, header values).
///
/// `percent-encoding` passes a malformed escape through as it is; the
/// binding calls it an error, so every `%` is checked to start one first.
fn percent_decode(s: &str, header: &str) -> Result<String> {
    let b = s.as_bytes();
    let malformed = b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !b
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(bad(format!("header {header} has an invalid %-escape")).with_field(header));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| bad(format!("header {header} does not decode to UTF-8")).with_field(header))
}

/// Standard base64 (RFC 4648 §4), padding optional but canonical when
/// present, surrounding whitespace ignored.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine;
    const STANDARD_PADDING_OPTIONAL: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    STANDARD_PADDING_OPTIONAL.decode(s.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_headers(_: &str) -> Option<String> {
        None
    }

    fn claim() -> Value {
        json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
            "metadata": {"name": "m-0", "namespace": "team-a", "uid": "u1"},
            "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}})
    }

    fn parse_json(v: &Value) -> Result<Parsed> {
        parse(
            Some("application/json"),
            &no_headers,
            v.to_string().as_bytes(),
        )
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (enc, dec) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
            ("Zm9vYg", "foob"),
            // Padding is optional, so an incomplete one is accepted too.
            ("Zg=", "f"),
            (" Zm9v\n", "foo"),
        ] {
            assert_eq!(base64_decode(enc).as_deref(), Some(dec.as_bytes()), "{enc}");
        }
        for bad in ["Z", "Zm9v!", "Zm9vY===", "Zm9v Zm9v", "Zm9v-_", "Zh=="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn percent_decoding_of_header_values() {
        assert_eq!(percent_decode("a%20b%25c", "h").unwrap(), "a b%c");
        assert_eq!(percent_decode("plain", "h").unwrap(), "plain");
        assert_eq!(percent_decode("%C3%A9", "h").unwrap(), "é");
        for bad in ["%", "%4", "%zz", "%+f", "%FF"] {
            assert_eq!(percent_decode(bad, "h").unwrap_err().status(), 400, "{bad}");
        }
    }

    #[test]
    fn classify_by_group_and_kind_only() {
        for v in ["v1alpha1", "v1beta1", "v1beta2", "v9"] {
            assert_eq!(
                ObjectKind::classify(&format!("ipam.cluster.x-k8s.io/{v}"), "IPAddressClaim"),
                Some(ObjectKind::Claim)
            );
        }
        // The in-cluster provider's pools share the CAPI IPAM group (served
        // only during a takeover); metal3's share no group of ours.
        assert_eq!(
            ObjectKind::classify("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool"),
            Some(ObjectKind::Pool(PoolKind::InCluster))
        );
        assert_eq!(
            ObjectKind::classify("ipam.metal3.io/v1alpha1", "IPPool"),
            None
        );
        assert_eq!(
            ObjectKind::classify("ipam.metal-ipam.dev/v1alpha1", "InClusterIPPool"),
            None
        );
        assert_eq!(
            ObjectKind::classify("other.example/v1", "IPAddressClaim"),
            None
        );
        assert_eq!(
            ObjectKind::classify("IPAddressClaim", "IPAddressClaim"),
            None
        );
    }

    #[test]
    fn watch_and_argo_vocabularies_are_case_insensitive() {
        for (t, format, action) in [
            ("ADDED", Format::Watch, Action::Upsert),
            ("modified", Format::Watch, Action::Upsert),
            ("Deleted", Format::Watch, Action::Delete),
            ("add", Format::ArgoEvents, Action::Upsert),
            ("UPDATE", Format::ArgoEvents, Action::Upsert),
            ("delete", Format::ArgoEvents, Action::Delete),
        ] {
            let p = parse_json(&json!({"type": t, "object": claim()})).unwrap();
            let Outcome::Object(ev) = p.outcome else {
                panic!("{t}: {p:?}")
            };
            assert_eq!((ev.format, ev.action), (format, action), "{t}");
        }
    }

    #[test]
    fn plain_shape_errors() {
        for (body, field) in [
            (json!({"object": claim()}), Some("type")),
            (json!({"type": 3, "object": claim()}), Some("type")),
            (json!({"type": "ADDED"}), Some("object")),
            (
                json!({"type": "ADDED", "object": claim(), "body": claim()}),
                None,
            ),
            (json!({"type": "ADDED", "object": "x"}), Some("object")),
            (
                json!({"type": "ADDED", "object": {"kind": "IPAddressClaim"}}),
                Some("object.apiVersion"),
            ),
            (json!([1, 2]), None),
        ] {
            let e = parse_json(&body).unwrap_err();
            assert_eq!(e.status(), 400, "{body}");
            assert_eq!(e.field(), field, "{body}: {e}");
        }
    }

    #[test]
    fn identity_rules() {
        let mut c = claim();
        c["metadata"]["name"] = json!("Bad_Name");
        let e = parse_json(&json!({"type": "ADDED", "object": c})).unwrap_err();
        assert_eq!(e.field(), Some("object.metadata.name"));
        let mut c = claim();
        c["metadata"].as_object_mut().unwrap().remove("namespace");
        let e = parse_json(&json!({"type": "ADDED", "object": c})).unwrap_err();
        assert_eq!(e.field(), Some("object.metadata.namespace"));
        let g = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
            "metadata": {"name": "edge", "namespace": "x"}});
        let e = parse_json(&json!({"type": "ADDED", "object": g})).unwrap_err();
        assert_eq!(e.field(), Some("object.metadata.namespace"));
        // An empty namespace on a cluster-scoped object is no namespace.
        let g = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
            "metadata": {"name": "edge", "namespace": ""}});
        let p = parse_json(&json!({"type": "ADDED", "object": g})).unwrap();
        let Outcome::Object(ev) = p.outcome else {
            panic!()
        };
        assert_eq!(ev.namespace, None);
        assert_eq!(ev.display(), "edge");
    }

    #[test]
    fn debug_output_redacts_the_token() {
        let p = Parsed {
            outcome: Outcome::Ignored {
                format: Format::KnativeBinary,
                reason: "x".into(),
            },
            token: Some("hunter2".into()),
        };
        let s = format!("{p:?}");
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains("<redacted>"), "{s}");
    }

    #[test]
    fn oversized_bodies_are_refused() {
        let big = vec![b' '; crate::MAX_BODY + 1];
        assert_eq!(parse(None, &no_headers, &big).unwrap_err().status(), 400);
        assert_eq!(presented_token(None, &no_headers, &big), None);
    }
}
