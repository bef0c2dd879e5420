//! HTTP-level handling of every route, independent of Spin.
//!
//! A function crate turns its Spin request into an [`ApiRequest`], its
//! component's entry (`http::components`, which authenticates it) calls
//! the handler here ([`pools`], [`allocate`], [`claims`]), and the shell
//! turns the [`ApiResponse`] back into a Spin response, printing
//! [`ApiResponse::log_line`]. Routing, method checks, body parsing, the
//! steps and error rendering happen here, so they are tested natively.

use serde_json::{json, Map, Value};

use crate::error::{Error, ErrorKind, Known, Result};
use crate::http::method_not_allowed;
use crate::ipam::claim::Claim;
use crate::ipam::ops::{self, PutOutcome};
use crate::ipam::pool::{PoolId, PoolKind, PoolObject};
use crate::kube::names;
use crate::kv::Ctx;
use crate::ports::kv::{KvStore, OpCounts};
use crate::routes::{Route, RouteKind};

pub use crate::MAX_BODY;

/// A request as the handlers see it.
#[derive(Debug, Clone, Copy)]
pub struct ApiRequest<'a> {
    /// HTTP method, upper case.
    pub method: &'a str,
    /// Path, without query string.
    pub path: &'a str,
    /// Query string without `?` (may be empty).
    pub query: &'a str,
    /// The `Authorization` header, if present.
    pub authorization: Option<&'a str>,
    /// The body.
    pub body: &'a [u8],
    /// Every header (names in lower case), in the order received.
    pub headers: &'a [(String, String)],
}

impl<'a> ApiRequest<'a> {
    /// The first header named `name` (compared without case).
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `Content-Type` header.
    pub fn content_type(&self) -> Option<&'a str> {
        self.header("content-type")
    }
}

/// A response plus what the log line needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body, if any.
    pub body: Option<Value>,
    /// Extra headers (besides `content-type`).
    pub headers: Vec<(&'static str, String)>,
    /// The route pattern that matched (for logs), e.g. `/v1/claims/{namespace}/{name}`.
    pub route: &'static str,
    /// What happened, e.g. `allocated`, `existing`, `released`, `error`.
    pub outcome: &'static str,
    /// Error reason, when the request failed.
    pub reason: Option<&'static str>,
    /// Objects touched: `("claim", "ns/name")`, `("pool", "ns/p")`, `("address", "10.0.0.5")`.
    pub objects: Vec<(&'static str, String)>,
    /// Operator-facing error detail for the log line (never in the body).
    pub detail: Option<String>,
    /// A text body instead of JSON: its content type and text (the node's
    /// network configuration).
    pub text: Option<(&'static str, String)>,
    /// The handler already counted this request's signature (inside its
    /// own write): the shell's request counting
    /// (`observe::counters::record_request`) then counts only its calls and
    /// conflicts. `false` from every constructor.
    pub counted: bool,
}

impl ApiResponse {
    /// A successful response with `body`, for `route`, logging `outcome`.
    pub fn success(
        status: u16,
        body: Option<Value>,
        route: &'static str,
        outcome: &'static str,
    ) -> Self {
        ApiResponse {
            status,
            body,
            headers: Vec::new(),
            route,
            outcome,
            reason: None,
            objects: Vec::new(),
            detail: None,
            text: None,
            counted: false,
        }
    }

    /// The response for an error: its status, its JSON body, `Retry-After`
    /// for transient errors and `WWW-Authenticate` for 401s.
    pub fn from_error(e: &Error, route: &'static str) -> Self {
        let mut headers = Vec::new();
        match e.kind() {
            ErrorKind::Unauthorized => headers.push((
                "www-authenticate",
                "Bearer realm=\"metal-ipam\"".to_string(),
            )),
            ErrorKind::Transient => headers.push(("retry-after", "1".to_string())),
            _ => {}
        }
        ApiResponse {
            status: e.status(),
            body: Some(e.body()),
            headers,
            route,
            outcome: "error",
            reason: Some(e.reason()),
            objects: Vec::new(),
            detail: e.detail().map(str::to_string),
            text: None,
            counted: false,
        }
    }

    /// Sets member `key` of the JSON body (if it has one).
    pub fn with_member(mut self, key: &str, value: Value) -> Self {
        if let Some(body) = self.body.as_mut() {
            body[key] = value;
        }
        self
    }

    /// Adds an object to the log line's `objects`.
    pub fn touching(mut self, kind: &'static str, what: String) -> Self {
        self.objects.push((kind, what));
        self
    }

    /// The one structured log line for this request: JSON with timestamp,
    /// component, method, path, route, status, outcome, reason, duration,
    /// key-value operation count and objects. Never contains credentials or
    /// bodies.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::http::api::*;
    /// let req = ApiRequest { method: "GET", path: "/v1/pools", query: "", authorization: Some("Bearer x"), body: b"", headers: &[] };
    /// let resp = list_pools(&dummy_ctx(), metal_ipam_core::ipam::pool::PoolKind::Namespaced);
    /// # fn dummy_ctx() -> metal_ipam_core::kv::Ctx<'static, metal_ipam_core::testing::MemKv> {
    /// #   let kv = Box::leak(Box::new(metal_ipam_core::testing::MemKv::new(metal_ipam_core::testing::Backend::SpinSqlite)));
    /// #   let env = Box::leak(Box::new(metal_ipam_core::testing::TestEnv::at(0)));
    /// #   metal_ipam_core::kv::Ctx { kv, env, swap_policy: metal_ipam_core::kv::SwapPolicy::Auto }
    /// # }
    /// let line = resp.log_line("pools", &req, 1_700_000_000_000, 0.4, Default::default());
    /// let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    /// assert_eq!(v["status"], 200);
    /// assert!(!line.contains("Bearer"));
    /// ```
    pub fn log_line(
        &self,
        component: &str,
        req: &ApiRequest<'_>,
        ts_millis: u64,
        duration_ms: f64,
        kv_ops: OpCounts,
    ) -> String {
        let objects: Map<String, Value> = self
            .objects
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::String(v.clone())))
            .collect();
        let mut line = json!({
            "ts": ts_millis,
            // A step still working on Metal is answered 503 so the forwarder
            // delivers again: expected, not an error.
            "level": match (self.status, self.outcome) {
                (_, "step-in-progress") => "info",
                (500.., _) => "error",
                (400.., _) => "warn",
                _ => "info",
            },
            "component": component,
            "method": req.method,
            "path": req.path,
            "route": self.route,
            "status": self.status,
            "outcome": self.outcome,
            "duration_ms": (duration_ms * 1000.0).round() / 1000.0,
            "kv_ops": kv_ops.total(),
            "objects": objects,
        });
        if let Some(r) = self.reason {
            line["reason"] = r.into();
        }
        if let Some(d) = &self.detail {
            line["detail"] = d.clone().into();
        }
        line.to_string()
    }
}

/// The request body as JSON: 413 past [`MAX_BODY`], 400 when empty or not
/// JSON.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value> {
    if body.len() > MAX_BODY {
        return Err(Error::payload_too_large(MAX_BODY));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::malformed("the request needs a JSON body"));
    }
    serde_json::from_slice(body).map_err(|e| {
        Error::new(
            ErrorKind::Malformed,
            "MalformedJSON",
            format!("the body is not valid JSON: {e}"),
        )
    })
}

fn path_name(kind: &str, v: &str, label: bool) -> Result<String> {
    let check = if label {
        names::check_label(v)
    } else {
        names::check_subdomain(v)
    };
    check.map_err(|m| Error::malformed(format!("invalid {kind} in the path: {m}")))?;
    Ok(v.to_string())
}

/// A pool route's pool with its names checked as the plain API checks
/// them (the name, then the namespace).
///
/// # Errors
/// 400 `Malformed` naming the field in the path.
pub(crate) fn checked_pool(id: &PoolId) -> Result<PoolId> {
    let name = path_name("name", &id.name, false)?;
    Ok(match &id.namespace {
        Some(ns) => PoolId::of(id.kind, &path_name("namespace", ns, true)?, &name),
        None => PoolId::of(id.kind, "", &name),
    })
}

/// A claim route's names checked as the plain API checks them (the
/// namespace, then the name).
///
/// # Errors
/// 400 `Malformed` naming the field in the path.
pub(crate) fn checked_claim(ns: &str, name: &str) -> Result<(String, String)> {
    let ns = path_name("namespace", ns, true)?;
    Ok((ns, path_name("name", name, false)?))
}

/// `GET /v1/pools`, `/v1/global-pools`, `/v1/prefix-pools`,
/// `/v1/global-prefix-pools` (`kind`): lists pools
/// (`{"apiVersion":"v1","kind":"List","items":[…]}`); `/v1/pools` lists
/// every kind, the others their own.
pub fn list_pools<K: KvStore>(ctx: &Ctx<'_, K>, kind: PoolKind) -> ApiResponse {
    let route = Route::PoolList(kind).template();
    let filter = (kind != PoolKind::Namespaced).then_some(kind);
    match ops::list_pools_in(ctx, filter) {
        Ok(listing) => {
            let n = listing.pools.len();
            let items: Vec<Value> = listing.pools.iter().map(|v| v.to_json()).collect();
            let mut body = json!({"apiVersion": "v1", "kind": "List", "items": items});
            let r = if listing.unreadable.is_empty() {
                ApiResponse::success(200, Some(body), route, "listed")
            } else {
                // Skipped, never fatal: each named with why, so one bad
                // record hides nothing else and can be repaired by PUT or
                // DELETE.
                let bad: Vec<Value> = listing
                    .unreadable
                    .iter()
                    .map(|(id, why)| {
                        json!({"kind": id.kind.kind_name(), "namespace": id.namespace,
                               "name": id.name, "error": why})
                    })
                    .collect();
                body["unreadable"] = Value::Array(bad);
                let names: Vec<String> = listing
                    .unreadable
                    .iter()
                    .map(|(id, _)| id.display())
                    .collect();
                ApiResponse::success(200, Some(body), route, "listed-with-unreadable")
                    .touching("unreadable", names.join(","))
            };
            r.touching("pools", n.to_string())
        }
        Err(e) => ApiResponse::from_error(&e, route),
    }
}

/// `/v1/pools/{namespace}/{name}`, `/v1/global-pools/{name}` and the
/// prefix pools' twins (`id`):
///
/// - `PUT` registers (201) or updates (200) it;
/// - `GET` returns it with `status.ipAddresses` (404 if unknown);
/// - `DELETE` deletes it (204, also when unknown; 409 `PoolInUse` while
///   addresses are allocated).
pub fn pool_object<K: KvStore>(ctx: &Ctx<'_, K>, req: &ApiRequest<'_>, id: &PoolId) -> ApiResponse {
    let route = Route::PoolObject(id.clone()).template();
    match checked_pool(id) {
        Ok(id) => pool_request(ctx, req, route, (id.kind, id)),
        Err(e) => ApiResponse::from_error(&e, route),
    }
}

/// `GET`, `PUT` or `DELETE` of one pool (its names already checked).
fn pool_request<K: KvStore>(
    ctx: &Ctx<'_, K>,
    req: &ApiRequest<'_>,
    route: &'static str,
    (kind, id): (PoolKind, PoolId),
) -> ApiResponse {
    let touched = id.display();
    let result = match req.method {
        "GET" => match ops::get_pool(ctx.kv, &id, ctx.env.now()) {
            Ok(Some(v)) => Ok(ApiResponse::success(200, Some(v.to_json()), route, "read")),
            Ok(None) => Err(Error::not_found(
                "PoolNotFound",
                format!("{} {} is not registered", kind.kind_name(), touched),
            )),
            Err(e) => Err(e),
        },
        "PUT" => parse_json(req.body)
            .and_then(|body| PoolObject::parse(&id, &body))
            .and_then(|obj| ops::put_pool(ctx, obj))
            .map(|(outcome, view)| {
                let (status, word) = match outcome {
                    PutOutcome::Created => (201, "created"),
                    PutOutcome::Updated => (200, "updated"),
                    PutOutcome::Unchanged => (200, "unchanged"),
                };
                ApiResponse::success(status, Some(view.to_json()), route, word)
            }),
        "DELETE" => ops::delete_pool(ctx, &id).map(|deleted| {
            ApiResponse::success(204, None, route, if deleted { "deleted" } else { "absent" })
        }),
        _ => return method_not_allowed(route, "GET, PUT, DELETE").touching("pool", touched),
    };
    match result {
        Ok(r) => r,
        Err(e) => ApiResponse::from_error(&e, route),
    }
    .touching("pool", touched)
}

/// The request signature (`observe::counters`) of `kind`'s route answered
/// `status` with `outcome`, as its component's shell records it: what an
/// allocation or a release counts in its pool record's own write, so its
/// answer carries `counted` and the shell adds nothing.
fn in_record_signature(kind: RouteKind, status: u16, outcome: &str) -> String {
    let route = kind.def();
    let component = route.served_by.first().map_or("", |c| c.name());
    crate::observe::counters::Signature::new(component, route.template, status, outcome, "")
        .encode()
}

/// `POST /v1/claims` with an `IPAddressClaim` (`allocate`).
///
/// Answers the claim's `IPAddress` (in the claim's apiVersion): 201 when
/// the address was bound by this request, 200 when the claim already had
/// it. Errors as documented on [`ops::allocate`] and [`Claim::parse`].
pub fn allocate<K: KvStore>(ctx: &Ctx<'_, K>, req: &ApiRequest<'_>) -> ApiResponse {
    let route = Route::Claims.template();
    let claim = match parse_json(req.body).and_then(|b| Claim::parse(&b)) {
        // The in-cluster provider's pools are served through Kubernetes
        // only, during a takeover (capi::takeover).
        Ok(c) if c.pool.kind.is_in_cluster() => {
            let e = Error::new(
                ErrorKind::Invalid,
                Known::UnsupportedPoolRef.as_str(),
                format!(
                    "spec.poolRef {} is the in-cluster provider's: metal-ipam serves it only through Kubernetes, while the kind is taken over (docs/takeover.md)",
                    c.pool.kind.kind_name()
                ),
            )
            .with_field("spec.poolRef");
            return ApiResponse::from_error(&e, route);
        }
        Ok(c) => c,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let claim_name = claim.id.display();
    let pool_name = claim.pool.display();
    // A new binding counts itself in its pool record's write (no operation
    // of its own): the signature its answer will have.
    let count_as = in_record_signature(RouteKind::Claims, 201, "allocated");
    let result = ops::allocate_counting(ctx, &claim, Some(&count_as)).and_then(|(a, counted)| {
        let body = a
            .record
            .to_ip_address(&claim.id.namespace, &claim.id.name)?
            .to_json();
        let mut r = if a.created {
            ApiResponse::success(201, Some(body), route, "allocated")
        } else {
            ApiResponse::success(200, Some(body), route, "existing")
        };
        if a.created {
            let at = Route::ClaimObject {
                ns: claim.id.namespace.clone(),
                name: claim.id.name.clone(),
            };
            r.headers.push(("location", at.path()));
        }
        r.counted = counted;
        Ok(r.touching("address", a.record.address.clone()))
    });
    match result {
        Ok(r) => r,
        Err(e) => ApiResponse::from_error(&e, route),
    }
    .touching("claim", claim_name)
    .touching("pool", pool_name)
}

/// `/v1/claims/{namespace}/{name}` (`release`).
///
/// - `GET` returns the claim's `IPAddress` (404 `ClaimNotFound` if unbound);
/// - `DELETE` releases its address: 204, also when the claim is unknown. An
///   optional `?uid=<uid>` releases only a binding of that uid.
pub fn claim_object<K: KvStore>(
    ctx: &Ctx<'_, K>,
    req: &ApiRequest<'_>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = RouteKind::ClaimObject.def().template;
    let (ns, name) = match checked_claim(ns, name) {
        Ok(v) => v,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let touched = format!("{ns}/{name}");
    let result = match req.method {
        "GET" => ops::get_claim(ctx.kv, &ns, &name).and_then(|rec| match rec {
            Some(rec) => Ok(ApiResponse::success(
                200,
                Some(rec.to_ip_address(&ns, &name)?.to_json()),
                route,
                "read",
            )
            .touching("address", rec.address)),
            None => Err(Error::not_found(
                "ClaimNotFound",
                format!("claim {touched} has no address"),
            )),
        }),
        "DELETE" => {
            let uid = req
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("uid="))
                .filter(|u| !u.is_empty());
            let count_as = in_record_signature(RouteKind::ClaimObject, 204, "released");
            crate::provision::assign::release_counting(ctx, &ns, &name, uid, Some(&count_as)).map(
                |(rec, counted)| match rec {
                    Some(rec) => {
                        let mut r = ApiResponse::success(204, None, route, "released")
                            .touching("address", rec.address);
                        r.counted = counted;
                        r
                    }
                    None => ApiResponse::success(204, None, route, "absent"),
                },
            )
        }
        _ => return method_not_allowed(route, "GET, DELETE").touching("claim", touched),
    };
    match result {
        Ok(r) => r,
        Err(e) => ApiResponse::from_error(&e, route),
    }
    .touching("claim", touched)
}
