//! phoenixNAP's OAuth 2.0 client credentials: the token request, its
//! answer, and the token kept with its expiry.
//!
//! The token endpoint takes `grant_type=client_credentials` as a form body,
//! the client authenticated with HTTP Basic (RFC 6749 §2.3.1: id and secret
//! form-urlencoded, joined by `:`, base64), and answers
//! `{"access_token", "token_type": "Bearer", "expires_in"}`.
//! A [`TokenCache`] hands out the token until [`REFRESH_MARGIN_MS`] before it
//! expires; a 401 from an API drops it so that the next request fetches a
//! fresh one, once ([`TokenCache::on_unauthorized`]): a second 401 with a
//! fresh token means the credentials are refused, and is the answer.
//!
//! The client secret and the access token are secrets: their `Debug` is
//! redacted and no error text carries them.

use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use crate::cloud::CloudError;

/// The token endpoint's path on the authentication server.
pub const TOKEN_PATH: &str = "/auth/realms/BMC/protocol/openid-connect/token";

/// phoenixNAP's authentication server.
pub const AUTH_URL: &str = "https://auth.phoenixnap.com";

/// The token endpoint on phoenixNAP's authentication server
/// ([`AUTH_URL`] and [`TOKEN_PATH`]).
pub const TOKEN_URL: &str =
    "https://auth.phoenixnap.com/auth/realms/BMC/protocol/openid-connect/token";

/// The form body of a token request.
pub const TOKEN_FORM: &str = "grant_type=client_credentials";

/// The content type of [`TOKEN_FORM`].
pub const FORM_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

/// A token is not used in its last 60 s: a request sent just before expiry
/// would meet a 401 on the way.
pub const REFRESH_MARGIN_MS: u64 = 60_000;

/// The longest lifetime trusted, whatever `expires_in` says (a day).
pub const MAX_LIFETIME_S: u64 = 86_400;

/// The characters form-urlencoding leaves as they are (RFC 6749
/// Appendix B: `application/x-www-form-urlencoded`, unreserved kept).
const FORM: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'*');

/// The client id and secret (Spin variables of the components that call
/// phoenixNAP only).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The OAuth client id.
    pub client_id: String,
    /// The OAuth client secret. Never logged, returned or stored.
    pub client_secret: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The `Authorization` header of a token request: `Basic` with the
    /// form-urlencoded id and secret.
    ///
    /// ```
    /// use metal_ipam_core::pnap::auth::Credentials;
    /// let c = Credentials { client_id: "id".into(), client_secret: "s:1".into() };
    /// // base64("id:s%3A1")
    /// assert_eq!(c.basic_authorization(), "Basic aWQ6cyUzQTE=");
    /// ```
    pub fn basic_authorization(&self) -> String {
        let id = utf8_percent_encode(&self.client_id, FORM).to_string();
        let secret = utf8_percent_encode(&self.client_secret, FORM).to_string();
        let joined = format!("{id}:{secret}");
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(joined)
        )
    }
}

/// An access token and when it expires.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    value: String,
    /// Unix time in milliseconds.
    expires_at_ms: u64,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

impl Token {
    /// The `Authorization` header value of an API request.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.value)
    }

    /// When it expires (Unix milliseconds).
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// Whether it may still be sent at `now_ms`.
    pub fn usable_at(&self, now_ms: u64) -> bool {
        now_ms.saturating_add(REFRESH_MARGIN_MS) < self.expires_at_ms
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    token_type: String,
    expires_in: u64,
}

/// Reads the token endpoint's 200 answer, received at `now_ms`.
///
/// # Errors
/// [`CloudError::Malformed`] if the body is not a bearer token answer (no
/// token, another `token_type`, a lifetime of zero); the message never
/// carries the body.
///
/// ```
/// use metal_ipam_core::pnap::auth::parse_token_answer;
/// let t = parse_token_answer(
///     br#"{"access_token":"abc","token_type":"Bearer","expires_in":3600}"#, 1_000).unwrap();
/// assert_eq!(t.bearer(), "Bearer abc");
/// assert_eq!(t.expires_at_ms(), 3_601_000);
/// assert!(parse_token_answer(br#"{"access_token":"abc","token_type":"mac","expires_in":1}"#, 0).is_err());
/// ```
pub fn parse_token_answer(body: &[u8], now_ms: u64) -> Result<Token, CloudError> {
    let malformed = |why: &str| CloudError::Malformed {
        detail: format!("phoenixNAP's token endpoint answered {why}"),
    };
    let answer: TokenAnswer = serde_json::from_slice(body)
        .map_err(|e| malformed(&format!("a body that is not a token answer ({e})")))?;
    if !answer.token_type.eq_ignore_ascii_case("bearer") {
        return Err(malformed(&format!(
            "token_type {:?}, not Bearer",
            answer.token_type
        )));
    }
    if answer.access_token.is_empty() || answer.expires_in == 0 {
        return Err(malformed("an empty token or a lifetime of 0 s"));
    }
    let lifetime_ms = answer.expires_in.min(MAX_LIFETIME_S).saturating_mul(1000);
    Ok(Token {
        value: answer.access_token,
        expires_at_ms: now_ms.saturating_add(lifetime_ms),
    })
}

/// The token of one client, fetched when needed and refreshed once on a
/// 401.
#[derive(Debug, Default, Clone)]
pub struct TokenCache {
    token: Option<Token>,
    /// Whether the token held was fetched after a 401 (a second 401 is the
    /// answer).
    fresh_after_401: bool,
}

impl TokenCache {
    /// The token to send at `now_ms`, or `None`: fetch one and
    /// [`store`](Self::store) it.
    pub fn current(&self, now_ms: u64) -> Option<&Token> {
        self.token.as_ref().filter(|t| t.usable_at(now_ms))
    }

    /// Keeps a freshly fetched token.
    pub fn store(&mut self, token: Token) {
        self.token = Some(token);
    }

    /// A request sent with the current token was answered 401. `true`:
    /// the token is dropped; fetch a new one and send the request again,
    /// once. `false`: the token was already fetched after a 401, so the
    /// credentials themselves are refused; the 401 is the answer.
    ///
    /// ```
    /// use metal_ipam_core::pnap::auth::{parse_token_answer, TokenCache};
    /// let mut cache = TokenCache::default();
    /// let token = || parse_token_answer(
    ///     br#"{"access_token":"t","token_type":"bearer","expires_in":300}"#, 0).unwrap();
    /// cache.store(token());
    /// assert!(cache.on_unauthorized());   // drop it, fetch again, retry once
    /// assert!(cache.current(0).is_none());
    /// cache.store(token());
    /// assert!(!cache.on_unauthorized());  // refused with a fresh token: stop
    /// ```
    pub fn on_unauthorized(&mut self) -> bool {
        if self.fresh_after_401 {
            return false;
        }
        self.token = None;
        self.fresh_after_401 = true;
        true
    }

    /// A request with the current token succeeded: a later 401 may refresh
    /// again.
    pub fn on_success(&mut self) {
        self.fresh_after_401 = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(token: &str, expires_in: u64) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "access_token": token, "token_type": "Bearer", "expires_in": expires_in,
            "refresh_expires_in": 0, "scope": "bmc bmc.read audit.read",
        }))
        .unwrap()
    }

    #[test]
    fn a_token_is_used_until_its_margin() {
        let t = parse_token_answer(&answer("a", 3600), 10_000).unwrap();
        assert!(t.usable_at(10_000));
        assert!(t.usable_at(10_000 + 3_600_000 - REFRESH_MARGIN_MS - 1));
        assert!(!t.usable_at(10_000 + 3_600_000 - REFRESH_MARGIN_MS));
        let mut cache = TokenCache::default();
        assert!(cache.current(0).is_none());
        cache.store(t);
        assert_eq!(cache.current(20_000).unwrap().bearer(), "Bearer a");
        assert!(cache.current(3_600_000).is_none());
    }

    #[test]
    fn lifetimes_are_bounded_and_bad_answers_refused_without_their_body() {
        let t = parse_token_answer(&answer("a", u64::MAX), 0).unwrap();
        assert_eq!(t.expires_at_ms(), MAX_LIFETIME_S * 1000);
        for bad in [
            br#"{"access_token":"secret-xyz","token_type":"Bearer","expires_in":0}"#.to_vec(),
            br#"{"access_token":"","token_type":"Bearer","expires_in":60}"#.to_vec(),
            br#"{"access_token":"secret-xyz","token_type":"MAC","expires_in":60}"#.to_vec(),
            br#"{"error":"invalid_client"}"#.to_vec(),
            b"<html>".to_vec(),
        ] {
            let e = parse_token_answer(&bad, 0).unwrap_err();
            assert!(matches!(e, CloudError::Malformed { .. }), "{e}");
            assert!(!e.to_string().contains("secret-xyz"), "{e}");
        }
    }

    #[test]
    fn a_success_rearms_the_refresh() {
        let mut cache = TokenCache::default();
        cache.store(parse_token_answer(&answer("a", 600), 0).unwrap());
        assert!(cache.on_unauthorized());
        cache.store(parse_token_answer(&answer("b", 600), 0).unwrap());
        cache.on_success();
        assert!(cache.on_unauthorized(), "a later 401 refreshes again");
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let c = Credentials {
            client_id: "id".into(),
            client_secret: "very-secret".into(),
        };
        let t = parse_token_answer(&answer("token-value", 60), 0).unwrap();
        let shown = format!("{c:?} {t:?}");
        assert!(!shown.contains("very-secret") && !shown.contains("token-value"));
        assert!(shown.contains("id"));
    }

    #[test]
    fn basic_authorization_form_encodes_before_base64() {
        let c = Credentials {
            client_id: "a b".into(),
            client_secret: "p&ss=é".into(),
        };
        let encoded = c.basic_authorization();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(encoded.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(String::from_utf8(raw).unwrap(), "a%20b:p%26ss%3D%C3%A9");
    }
}
