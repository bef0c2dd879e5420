//! HTTP: requests and responses independent of Spin, authentication, the
//! plain HTTP API and one entry point per Spin component.
//!
//! - [`api`]: [`api::ApiRequest`] / [`api::ApiResponse`] (rendering, the log
//!   line) and the plain HTTP API routes (`/v1/pools`, `/v1/claims`).
//! - [`auth`]: the bearer-token check.
//! - [`components`]: which routes each component serves and what it needs
//!   (store, Kubernetes client, tokens); the shells call these.
//!
//! The status of an error is decided in one place,
//! [`crate::ErrorKind::status`]. This is the outermost layer of the core:
//! it may import everything else in the crate.

pub mod api;
pub mod auth;
pub mod components;

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
