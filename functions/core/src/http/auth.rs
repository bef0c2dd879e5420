//! Bearer-token authentication, and the one check of a request against a
//! route's policy ([`Auth`], [`authorize`]).

use crate::error::{Error, ErrorKind, Result};
use crate::routes::Auth;

/// Compares two byte strings in time that depends only on their lengths,
/// never on where they differ.
///
/// # Examples
/// ```
/// use metal_ipam_core::http::auth::constant_time_eq;
/// assert!(constant_time_eq(b"s3cret", b"s3cret"));
/// assert!(!constant_time_eq(b"s3cret", b"s3cre7"));
/// assert!(!constant_time_eq(b"s3cret", b"s3cret-longer"));
/// ```
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let len = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..len {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    // Keep the optimiser from short-circuiting the loop.
    std::hint::black_box(diff) == 0
}

/// Checks an `Authorization` header against the configured token.
///
/// # Errors
/// 401 `Unauthorized` for a missing, malformed or wrong credential (the
/// message never echoes it); 500 `AuthNotConfigured` when the configured
/// token is empty, so a deployment without a token serves nothing.
///
/// # Examples
/// ```
/// use metal_ipam_core::http::auth::check_bearer;
/// assert!(check_bearer("tok", Some("Bearer tok")).is_ok());
/// assert!(check_bearer("tok", Some("bearer tok")).is_ok());
/// assert_eq!(check_bearer("tok", Some("Bearer nope")).unwrap_err().status(), 401);
/// assert_eq!(check_bearer("tok", None).unwrap_err().status(), 401);
/// assert_eq!(check_bearer("", Some("Bearer ")).unwrap_err().status(), 500);
/// ```
pub fn check_bearer(expected: &str, header: Option<&str>) -> Result<()> {
    if expected.is_empty() {
        return Err(Error::new(
            ErrorKind::Internal,
            "AuthNotConfigured",
            "the api_token variable is empty; refusing every request",
        ));
    }
    let unauthorized = |m: &str| Error::new(ErrorKind::Unauthorized, "Unauthorized", m);
    let header =
        header.ok_or_else(|| unauthorized("an Authorization: Bearer token is required"))?;
    let (scheme, token) = header
        .trim()
        .split_once(' ')
        .ok_or_else(|| unauthorized("the Authorization header must be 'Bearer <token>'"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized(
            "the Authorization header must be 'Bearer <token>'",
        ));
    }
    if constant_time_eq(token.trim().as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(unauthorized("the bearer token is not valid"))
    }
}

/// The configured tokens (an empty optional token accepts nothing).
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    /// The API token (every route).
    pub api: &'a str,
    /// The read token ([`Auth::Read`]).
    pub read: &'a str,
    /// The events token ([`Auth::Events`]).
    pub events: &'a str,
}

/// Checks a request's credential against `policy`: its `Authorization`
/// header, and for [`Auth::Events`] the token the event presents
/// (`presented`, read from the body or the headers by the caller).
/// [`Auth::None`] accepts anything.
///
/// # Errors
/// The API token's refusal ([`check_bearer`]: 401, or 500 when it is not
/// configured) when no accepted credential matches.
pub fn authorize(
    policy: Auth,
    tokens: &Tokens<'_>,
    authorization: Option<&str>,
    presented: impl FnOnce() -> Option<String>,
) -> Result<()> {
    let api = check_bearer(tokens.api, authorization);
    let other = |token: &str| !token.is_empty() && check_bearer(token, authorization).is_ok();
    let ok = api.is_ok()
        || match policy {
            Auth::None => true,
            Auth::Api => false,
            Auth::Read => other(tokens.read),
            Auth::Events => {
                other(tokens.events)
                    || (!tokens.events.is_empty()
                        && presented().is_some_and(|t| {
                            constant_time_eq(t.as_bytes(), tokens.events.as_bytes())
                        }))
            }
        };
    if ok {
        return Ok(());
    }
    Err(api.err().unwrap_or_else(|| {
        Error::new(
            ErrorKind::Unauthorized,
            "Unauthorized",
            "the bearer token is not valid",
        )
    }))
}
