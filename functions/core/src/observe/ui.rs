//! The browser view's page and files: plain HTML, CSS and a little
//! vanilla JavaScript, embedded in the component (no build step, nothing
//! loaded from elsewhere). The page and its files hold no data and no
//! secret, so they are served without a token; every piece of data comes
//! from the authenticated routes under `/ui/api/` ([`super::view`]).
//!
//! # Authentication: a bearer token from `sessionStorage`, not a cookie
//!
//! The page asks for a token (the API token, or better the read token)
//! in a form, keeps it in `sessionStorage` and sends it as
//! `Authorization: Bearer` from `fetch`; a 401 forgets it and asks again,
//! "Sign out" forgets it.
//!
//! - **No CSRF surface.** Nothing is sent by the browser on its own: there
//!   is no ambient credential (no cookie, no HTTP authentication), so a
//!   page of another site cannot make the browser send an authenticated
//!   request, and the component needs no CSRF token, `SameSite` rule or
//!   origin check. The data routes answer only what the header proves.
//! - **Never in a URL.** The token is not in a query string or fragment,
//!   so it is in no browser history, bookmark, server or proxy access log
//!   and no `Referer` (which `Referrer-Policy: no-referrer` suppresses
//!   anyway).
//! - **Short-lived in the browser.** `sessionStorage` belongs to one tab
//!   and is cleared when the tab closes; it is not shared with other tabs
//!   or written to disk like a persistent cookie.
//! - **XSS, the risk of storage readable by script, is mitigated** by the
//!   [`CONTENT_SECURITY_POLICY`]: `default-src 'self'` with no inline
//!   script or style and no other origin, so the only script that runs is
//!   `app.js`; it inserts every piece of data with `textContent` or text
//!   nodes, never as HTML. `frame-ancestors 'none'` (and
//!   `X-Frame-Options: DENY`) prevent click-jacking, `form-action 'none'`
//!   and `base-uri 'none'` leave injected markup nowhere to send data.
//! - **Least privilege.** The `read_token` variable is accepted on the
//!   read-only routes only (`/v1/metrics`, `/ui/api/…`): operators hand it
//!   to people who look; it changes nothing, so a leaked read token
//!   discloses the view and nothing more.
//!
//! A cookie would bring the reverse trade: `HttpOnly` hides it from
//! script, but it is ambient (CSRF to defend on every route), needs a
//! login endpoint to set it and a session to revoke, and would be sent by
//! the browser to the whole app, not to the read routes only.

/// The Content-Security-Policy of the page and its files: this origin
/// only, no inline script or style, not framed, no form target.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The page: content type and text.
pub fn page() -> (&'static str, &'static str) {
    (HTML, include_str!("assets/index.html"))
}

/// A file of the page by name (`app.css`, `app.js`): content type and
/// text; `None` for any other name.
pub fn asset(file: &str) -> Option<(&'static str, &'static str)> {
    match file {
        "app.css" => Some((CSS, include_str!("assets/app.css"))),
        "app.js" => Some((JS, include_str!("assets/app.js"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_and_files_hold_no_inline_script_or_style() {
        let (_, html) = page();
        assert!(html.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(!html.contains("style="), "no inline style");
        assert_eq!(html.matches("<script").count(), 1, "one external script");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "nothing from elsewhere"
        );
        let (_, js) = asset("app.js").unwrap();
        assert!(!js.contains("innerHTML") && !js.contains("insertAdjacentHTML"));
        assert!(asset("../spin.toml").is_none() && asset("index.html").is_none());
    }
}
