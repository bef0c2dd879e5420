//! HTTP: requests and responses independent of Spin, authentication, the
//! dispatcher and the routes' handlers.
//!
//! - [`dispatch`]: the dispatcher: a request to a component through the
//!   route table ([`crate::routes`]): public routes, one authentication by
//!   the row's policy, 404, 405 with the row's `Allow`, then the row's
//!   handler; one entry per component. The shells call these.
//! - [`services`]: [`services::Services`] (store, Kubernetes and Metal
//!   clients, tokens): what a handler has at hand.
//! - [`api`]: [`api::ApiRequest`] / [`api::ApiResponse`] (rendering, the log
//!   line) and the plain HTTP API's handlers (`/v1/pools`, `/v1/claims`).
//! - [`auth`]: the bearer-token check and [`auth::authorize`], the one
//!   check of a credential against a route's policy.
//! - `steps`, `network`, `read`: the other handlers (the Kubernetes side's
//!   steps, poll, reconcile, events and admission; a machine's network and
//!   the VLAN batches; metrics and the browser view).
//!
//! The status of an error is decided in one place,
//! [`crate::ErrorKind::status`]. This is the outermost layer of the core:
//! it may import everything else in the crate.

pub mod api;
pub mod auth;
pub mod dispatch;
mod network;
mod read;
pub mod services;
mod steps;

use crate::error::{Error, ErrorKind};
use api::ApiResponse;

/// 405 `MethodNotAllowed` with the `Allow` header listing `allowed`.
pub(crate) fn method_not_allowed(route: &'static str, allowed: &str) -> ApiResponse {
    let e = Error::new(
        ErrorKind::MethodNotAllowed,
        "MethodNotAllowed",
        format!("{route} accepts {allowed}"),
    );
    let mut r = ApiResponse::from_error(&e, route);
    r.headers.push(("allow", allowed.to_string()));
    r
}

/// 404 `NoSuchRoute` for a path no route of the component matches.
pub(crate) fn no_route(path: &str) -> ApiResponse {
    ApiResponse::from_error(
        &Error::not_found("NoSuchRoute", format!("no route for {path}")),
        "",
    )
}
