//! Bearer-token authentication.

use crate::error::{Error, ErrorKind, Result};

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
