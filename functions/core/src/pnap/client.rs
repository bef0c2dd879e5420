//! The phoenixNAP API client: the OAuth token ([`super::auth`]) fetched
//! when needed and refreshed once on a 401, retries within a budget
//! ([`crate::cloud::retry`]: 429 after `Retry-After`, 5xx and lost answers
//! retried for GET, PUT, PATCH and DELETE, never for a POST, whose outcome
//! is then unknown: look the resource up by name before creating it
//! again), error bodies, and one typed method per call metal-ipam makes,
//! over the [`HttpClient`] port.
//!
//! Requests go to `<api_url>/<api>/v1/…` (`bmc`, `networks`, `ips`,
//! `audit`) with `Authorization: Bearer <token>` and
//! `Accept: application/json`; the token request goes to
//! [`PnapConfig::token_url`] with HTTP Basic. Neither the client secret
//! nor the token appears in an error or in `Debug`.

use std::cell::{Cell, RefCell};

use http::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::auth::{
    parse_token_answer, Credentials, Token, TokenCache, FORM_CONTENT_TYPE, TOKEN_FORM, TOKEN_URL,
};
use super::model::{
    ErrorBody, Event, IpBlock, IpBlockCreate, PrivateNetwork, PrivateNetworkCreate, PublicNetwork,
    PublicNetworkCreate, PublicNetworkIpBlock, PublicNetworkIpBlockCreate, Server,
    ServerNetworkUpdate, ServerPrivateNetwork, ServerPublicNetwork,
};
use crate::cloud::attempts::Attempts;
use crate::cloud::retry::RetryPolicy;
use crate::cloud::{CloudError, CloudResult};
use crate::ports::http::{headers, HttpClient};
use crate::ports::Env;

/// phoenixNAP's API server.
pub const API_URL: &str = "https://api.phoenixnap.com";

/// The events read at most per audit log request.
pub const EVENTS_LIMIT: u32 = 1_000;

/// Where phoenixNAP is and how to authenticate.
#[derive(Clone, PartialEq, Eq)]
pub struct PnapConfig {
    /// The API server, e.g. [`API_URL`] (no trailing slash needed).
    pub api_url: String,
    /// The OAuth token endpoint, e.g. [`TOKEN_URL`].
    pub token_url: String,
    /// The client id and secret.
    pub credentials: Credentials,
    /// Retry limits per request.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for PnapConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PnapConfig")
            .field("api_url", &self.api_url)
            .field("token_url", &self.token_url)
            .field("credentials", &self.credentials)
            .field("retry", &self.retry)
            .finish()
    }
}

impl PnapConfig {
    /// phoenixNAP's own endpoints with `credentials` and the default retry
    /// policy.
    pub fn public(credentials: Credentials) -> PnapConfig {
        PnapConfig {
            api_url: API_URL.into(),
            token_url: TOKEN_URL.into(),
            credentials,
            retry: RetryPolicy::default(),
        }
    }
}

/// Characters escaped in a path segment or query value: all but
/// unreserved ones.
const ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn seg(s: &str) -> String {
    utf8_percent_encode(s, ESCAPE).to_string()
}

const PRIVATE_NETWORKS: &str = "/networks/v1/private-networks";
const PUBLIC_NETWORKS: &str = "/networks/v1/public-networks";
const IP_BLOCKS: &str = "/ips/v1/ip-blocks";
const SERVERS: &str = "/bmc/v1/servers";
const EVENTS: &str = "/audit/v1/events";

fn server_private(server: &str) -> String {
    format!(
        "{SERVERS}/{}/network-configuration/private-network-configuration/private-networks",
        seg(server)
    )
}

fn server_public(server: &str) -> String {
    format!(
        "{SERVERS}/{}/network-configuration/public-network-configuration/public-networks",
        seg(server)
    )
}

/// The client: configuration, transport, clock and the token, counting its
/// requests.
pub struct Pnap<'a, H: HttpClient + ?Sized, E: Env + ?Sized> {
    http: &'a H,
    cfg: &'a PnapConfig,
    env: &'a E,
    tokens: RefCell<TokenCache>,
    calls: Cell<u32>,
    /// A shorter retry budget for the next requests (the poll's reads).
    budget_ms: Cell<Option<u64>>,
}

impl<'a, H: HttpClient + ?Sized, E: Env + ?Sized> Pnap<'a, H, E> {
    /// A client for `cfg` over `http`, waiting and timing with `env`,
    /// without a token yet.
    pub fn new(http: &'a H, cfg: &'a PnapConfig, env: &'a E) -> Self {
        Pnap {
            http,
            cfg,
            env,
            tokens: RefCell::new(TokenCache::default()),
            calls: Cell::new(0),
            budget_ms: Cell::new(None),
        }
    }

    /// Runs `f` with each request's retry budget at most `budget_ms`.
    pub fn within<T>(&self, budget_ms: u64, f: impl FnOnce(&Self) -> T) -> T {
        let before = self.budget_ms.replace(Some(budget_ms));
        let out = f(self);
        self.budget_ms.set(before);
        out
    }

    /// HTTP requests sent (token requests and retries included).
    pub fn calls(&self) -> u32 {
        self.calls.get()
    }

    /// Sends one API request: a token first if none is usable, the request
    /// with retries, and on a 401 a fresh token and the request once more.
    /// Returns the status and body of a 2xx.
    ///
    /// # Errors
    /// See [`CloudError`]; a 4xx other than 429 is [`CloudError::Api`] with
    /// the body's `message` and `validationErrors`.
    pub fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> CloudResult<(u16, Vec<u8>)> {
        let mut url = format!("{}{path}", self.cfg.api_url.trim_end_matches('/'));
        for (i, (k, v)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(k);
            url.push('=');
            url.push_str(&seg(v));
        }
        let request = format!("{method} {path}");
        let bytes = body.map(|b| b.to_string().into_bytes());
        loop {
            let bearer = self.token()?.bearer();
            let build = || {
                let mut b = http::Request::builder()
                    .method(method.clone())
                    .uri(&url)
                    .header(headers::AUTHORIZATION, &bearer)
                    .header(headers::ACCEPT, "application/json")
                    .header(headers::USER_AGENT, user_agent());
                if bytes.is_some() {
                    b = b.header(headers::CONTENT_TYPE, "application/json");
                }
                b.body(bytes.clone().unwrap_or_default())
            };
            let repeatable = method != Method::POST;
            match self.with_retries(&request, repeatable, build)? {
                resp if resp.status().as_u16() == 401 => {
                    if !self.tokens.borrow_mut().on_unauthorized() {
                        return Err(api_error(request, resp));
                    }
                }
                resp if resp.status().is_success() => {
                    self.tokens.borrow_mut().on_success();
                    return Ok((resp.status().as_u16(), resp.into_body()));
                }
                resp => return Err(api_error(request, resp)),
            }
        }
    }

    /// The token to send: the cached one, or a fresh one from the token
    /// endpoint (a request that is safe to repeat).
    fn token(&self) -> CloudResult<Token> {
        let now = self.env.now_ms();
        if let Some(t) = self.tokens.borrow().current(now) {
            return Ok(t.clone());
        }
        let authorization = self.cfg.credentials.basic_authorization();
        let build = || {
            http::Request::builder()
                .method(Method::POST)
                .uri(&self.cfg.token_url)
                .header(headers::AUTHORIZATION, &authorization)
                .header(headers::CONTENT_TYPE, FORM_CONTENT_TYPE)
                .header(headers::ACCEPT, "application/json")
                .header(headers::USER_AGENT, user_agent())
                .body(TOKEN_FORM.as_bytes().to_vec())
        };
        let request = "POST token".to_owned();
        let resp = self.with_retries(&request, true, build)?;
        if !resp.status().is_success() {
            // 400/401 `invalid_client`: the credentials are refused. The
            // body is OAuth's error, which names no secret.
            let status = resp.status().as_u16();
            let body: Value = serde_json::from_slice(resp.body()).unwrap_or(Value::Null);
            let messages = ["error", "error_description"]
                .iter()
                .filter_map(|k| body.get(*k).and_then(Value::as_str))
                .map(str::to_owned)
                .collect();
            return Err(CloudError::Api {
                status,
                request: "POST token (phoenixNAP's client id and secret)".into(),
                messages,
            });
        }
        let token = parse_token_answer(resp.body(), self.env.now_ms())?;
        self.tokens.borrow_mut().store(token.clone());
        Ok(token)
    }

    /// Sends what `build` makes through the shared attempt loop
    /// ([`Attempts`]), within the budget (shortened by [`Pnap::within`]).
    fn with_retries(
        &self,
        request: &str,
        repeatable: bool,
        build: impl Fn() -> http::Result<http::Request<Vec<u8>>>,
    ) -> CloudResult<http::Response<Vec<u8>>> {
        let budget_ms = self.budget_ms.get().map_or(self.cfg.retry.budget_ms, |b| {
            b.min(self.cfg.retry.budget_ms)
        });
        let attempts = Attempts {
            http: self.http,
            env: self.env,
            policy: RetryPolicy {
                budget_ms,
                ..self.cfg.retry
            },
            calls: &self.calls,
        };
        attempts.send(request, repeatable, build, |_| {})
    }

    fn json<T: DeserializeOwned>(request: &str, body: &[u8]) -> CloudResult<T> {
        serde_json::from_slice(body).map_err(|e| CloudError::Malformed {
            detail: format!("{request}: {e}"),
        })
    }

    /// GETs and reads `T`; `None` on 404.
    fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> CloudResult<Option<T>> {
        match self.send(Method::GET, path, query, None) {
            Ok((_, body)) => Self::json(path, &body).map(Some),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// POSTs `input` and reads the answer.
    fn post<I: Serialize, T: DeserializeOwned>(&self, path: &str, input: &I) -> CloudResult<T> {
        let body = serde_json::to_value(input).map_err(|e| CloudError::Malformed {
            detail: format!("POST {path}: {e}"),
        })?;
        let (_, answer) = self.send(Method::POST, path, &[], Some(&body))?;
        Self::json(path, &answer)
    }

    /// PATCHes `input` and reads the answer.
    fn patch<I: Serialize, T: DeserializeOwned>(&self, path: &str, input: &I) -> CloudResult<T> {
        let body = serde_json::to_value(input).map_err(|e| CloudError::Malformed {
            detail: format!("PATCH {path}: {e}"),
        })?;
        let (_, answer) = self.send(Method::PATCH, path, &[], Some(&body))?;
        Self::json(path, &answer)
    }

    /// DELETEs: `true` if this call deleted it or started to, `false` if it
    /// was gone (404).
    fn delete(&self, path: &str) -> CloudResult<bool> {
        match self.send(Method::DELETE, path, &[], None) {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    // -- private networks ---------------------------------------------------

    /// The private networks, of `location` if given.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn private_networks(&self, location: Option<&str>) -> CloudResult<Vec<PrivateNetwork>> {
        let query: Vec<(&str, String)> = location
            .map(|l| ("location", l.into()))
            .into_iter()
            .collect();
        Ok(self.get(PRIVATE_NETWORKS, &query)?.unwrap_or_default())
    }

    /// One private network; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn private_network(&self, id: &str) -> CloudResult<Option<PrivateNetwork>> {
        self.get(&format!("{PRIVATE_NETWORKS}/{}", seg(id)), &[])
    }

    /// Creates a private network. Not repeated after a lost answer
    /// ([`CloudError::OutcomeUnknown`]): look it up by its unique name.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn create_private_network(
        &self,
        input: &PrivateNetworkCreate,
    ) -> CloudResult<PrivateNetwork> {
        self.post(PRIVATE_NETWORKS, input)
    }

    /// Deletes a private network; `false` if it was gone. Idempotent.
    ///
    /// # Errors
    /// See [`Pnap::send`] (400 while servers are on it).
    pub fn delete_private_network(&self, id: &str) -> CloudResult<bool> {
        self.delete(&format!("{PRIVATE_NETWORKS}/{}", seg(id)))
    }

    // -- public networks and IP blocks --------------------------------------

    /// The public networks, of `location` if given.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn public_networks(&self, location: Option<&str>) -> CloudResult<Vec<PublicNetwork>> {
        let query: Vec<(&str, String)> = location
            .map(|l| ("location", l.into()))
            .into_iter()
            .collect();
        Ok(self.get(PUBLIC_NETWORKS, &query)?.unwrap_or_default())
    }

    /// One public network; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn public_network(&self, id: &str) -> CloudResult<Option<PublicNetwork>> {
        self.get(&format!("{PUBLIC_NETWORKS}/{}", seg(id)), &[])
    }

    /// Creates a public network (not repeated after a lost answer).
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn create_public_network(&self, input: &PublicNetworkCreate) -> CloudResult<PublicNetwork> {
        self.post(PUBLIC_NETWORKS, input)
    }

    /// Deletes a public network; `false` if it was gone.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn delete_public_network(&self, id: &str) -> CloudResult<bool> {
        self.delete(&format!("{PUBLIC_NETWORKS}/{}", seg(id)))
    }

    /// Attaches IP block `block` to public network `network` (asynchronous:
    /// 202). Not repeated after a lost answer: read the network.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn attach_ip_block(&self, network: &str, block: &str) -> CloudResult<PublicNetworkIpBlock> {
        let input = PublicNetworkIpBlockCreate { id: block.into() };
        self.post(
            &format!("{PUBLIC_NETWORKS}/{}/ip-blocks", seg(network)),
            &input,
        )
    }

    /// Detaches an IP block from a public network; `false` if it was not
    /// attached (404).
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn detach_ip_block(&self, network: &str, block: &str) -> CloudResult<bool> {
        self.delete(&format!(
            "{PUBLIC_NETWORKS}/{}/ip-blocks/{}",
            seg(network),
            seg(block)
        ))
    }

    /// Every IP block of the account.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn ip_blocks(&self) -> CloudResult<Vec<IpBlock>> {
        Ok(self.get(IP_BLOCKS, &[])?.unwrap_or_default())
    }

    /// One IP block; `None` if it does not exist.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn ip_block(&self, id: &str) -> CloudResult<Option<IpBlock>> {
        self.get(&format!("{IP_BLOCKS}/{}", seg(id)), &[])
    }

    /// Orders an IP block (not repeated after a lost answer: look it up by
    /// its description).
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn create_ip_block(&self, input: &IpBlockCreate) -> CloudResult<IpBlock> {
        self.post(IP_BLOCKS, input)
    }

    /// Deletes an IP block; `false` if it was gone.
    ///
    /// # Errors
    /// See [`Pnap::send`] (an assigned block is refused).
    pub fn delete_ip_block(&self, id: &str) -> CloudResult<bool> {
        self.delete(&format!("{IP_BLOCKS}/{}", seg(id)))
    }

    // -- servers --------------------------------------------------------------

    /// One server with its network configuration; `None` if it does not
    /// exist.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn server(&self, id: &str) -> CloudResult<Option<Server>> {
        self.get(&format!("{SERVERS}/{}", seg(id)), &[])
    }

    /// Puts a server on a private network with `membership.ips`
    /// (asynchronous: the answer reads `in-progress`). Not repeated after a
    /// lost answer: read the server.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn join_private_network(
        &self,
        server: &str,
        membership: &ServerPrivateNetwork,
    ) -> CloudResult<ServerPrivateNetwork> {
        self.post(&server_private(server), membership)
    }

    /// Sets the IPs a server has on a private network it is on (not
    /// empty: leave the network instead).
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn update_private_ips(
        &self,
        server: &str,
        network: &str,
        ips: &[String],
    ) -> CloudResult<ServerPrivateNetwork> {
        self.patch(
            &format!("{}/{}", server_private(server), seg(network)),
            &ServerNetworkUpdate { ips: ips.to_vec() },
        )
    }

    /// Takes a server off a private network; `false` if it was not on it.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn leave_private_network(&self, server: &str, network: &str) -> CloudResult<bool> {
        self.delete(&format!("{}/{}", server_private(server), seg(network)))
    }

    /// Puts a server on a public network with `membership.ips` (from the
    /// network's blocks; asynchronous). Not repeated after a lost answer.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn join_public_network(
        &self,
        server: &str,
        membership: &ServerPublicNetwork,
    ) -> CloudResult<ServerPublicNetwork> {
        self.post(&server_public(server), membership)
    }

    /// Sets the IPs a server has on a public network it is on (not empty).
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn update_public_ips(
        &self,
        server: &str,
        network: &str,
        ips: &[String],
    ) -> CloudResult<ServerPublicNetwork> {
        self.patch(
            &format!("{}/{}", server_public(server), seg(network)),
            &ServerNetworkUpdate { ips: ips.to_vec() },
        )
    }

    /// Takes a server off a public network; `false` if it was not on it.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn leave_public_network(&self, server: &str, network: &str) -> CloudResult<bool> {
        self.delete(&format!("{}/{}", server_public(server), seg(network)))
    }

    // -- audit log --------------------------------------------------------------

    /// The audit log's events from `from` (RFC 3339, inclusive), oldest
    /// first, at most [`EVENTS_LIMIT`]; a 206 (a truncated list) reads like
    /// a 200.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn events(&self, from: &str) -> CloudResult<Vec<Event>> {
        let query = [
            ("from", from.to_owned()),
            ("limit", EVENTS_LIMIT.to_string()),
            ("order", "ASC".to_owned()),
        ];
        let (_, body) = self.send(Method::GET, EVENTS, &query, None)?;
        Self::json(EVENTS, &body)
    }

    /// The newest event of the audit log, if there is one.
    ///
    /// # Errors
    /// See [`Pnap::send`].
    pub fn newest_event(&self) -> CloudResult<Option<Event>> {
        let query = [("limit", "1".to_owned()), ("order", "DESC".to_owned())];
        let (_, body) = self.send(Method::GET, EVENTS, &query, None)?;
        let events: Vec<Event> = Self::json(EVENTS, &body)?;
        Ok(events.into_iter().next())
    }
}

fn user_agent() -> &'static str {
    concat!("metal-ipam/", env!("CARGO_PKG_VERSION"))
}

/// [`CloudError::Api`] for a non-2xx answer, with phoenixNAP's messages.
fn api_error(request: String, resp: http::Response<Vec<u8>>) -> CloudError {
    let status = resp.status().as_u16();
    let messages = serde_json::from_slice::<ErrorBody>(resp.body())
        .map(ErrorBody::messages)
        .unwrap_or_default();
    CloudError::Api {
        status,
        request,
        messages,
    }
}

/// phoenixNAP's failure as metal-ipam's error (reasons `Pnap…`): 404
/// `PnapNotFound`; 401/403 `PnapForbidden`; 400, 409 and 422, which
/// phoenixNAP answers when the account's state refuses a change (a name or
/// VLAN taken, members left, a block assigned), `PnapRefused` (409);
/// 5xx, rate limits and time budgets `PnapUnavailable` (503); a lost
/// answer `PnapOutcomeUnknown` (503); unreadable bodies, TLS and the
/// runtime's refusals 500. The detail is phoenixNAP's message.
pub fn pnap_error(e: CloudError) -> crate::error::Error {
    let detail = e.to_string();
    let (kind, reason, message) = match &e {
        CloudError::Api { status: 404, .. } => (
            crate::error::ErrorKind::NotFound,
            "PnapNotFound",
            "a phoenixNAP resource does not exist",
        ),
        CloudError::Api {
            status: 401 | 403, ..
        } => (
            crate::error::ErrorKind::Internal,
            "PnapForbidden",
            "phoenixNAP refused the client credentials or their permissions",
        ),
        CloudError::Api {
            status: 400 | 409 | 422,
            ..
        } => (
            crate::error::ErrorKind::Conflict,
            "PnapRefused",
            "phoenixNAP refused the change in the account's current state",
        ),
        CloudError::Api { status, .. } if *status >= 500 => (
            crate::error::ErrorKind::Transient,
            "PnapUnavailable",
            "phoenixNAP is unavailable; retry",
        ),
        CloudError::Api { .. } => (
            crate::error::ErrorKind::Internal,
            "PnapRejected",
            "phoenixNAP rejected a request metal-ipam built",
        ),
        CloudError::Unavailable { .. } => (
            crate::error::ErrorKind::Transient,
            "PnapUnavailable",
            "phoenixNAP is rate limiting or unavailable; retry",
        ),
        CloudError::OutcomeUnknown { .. } => (
            crate::error::ErrorKind::Transient,
            "PnapOutcomeUnknown",
            "a phoenixNAP request may or may not have taken effect; retry (the step looks before it creates again)",
        ),
        CloudError::Malformed { .. } => (
            crate::error::ErrorKind::Internal,
            "PnapMalformed",
            "phoenixNAP answered with a body metal-ipam cannot read",
        ),
        CloudError::Tls { .. } => (
            crate::error::ErrorKind::Internal,
            "PnapTlsFailed",
            "the TLS connection to phoenixNAP failed; retrying does not help",
        ),
        CloudError::Denied { .. } => (
            crate::error::ErrorKind::Internal,
            "PnapDenied",
            "the runtime refused the request to phoenixNAP: check the API URL and the component's allowed_outbound_hosts",
        ),
    };
    crate::error::Error::new(kind, reason, message).with_detail(detail)
}
