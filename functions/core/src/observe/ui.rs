//! (being written) The browser view's page and files.

/// The Content-Security-Policy of the page and its files.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The page: content type and text.
pub fn page() -> (&'static str, &'static str) {
    (
        "text/html; charset=utf-8",
        "<!doctype html><title>metal-ipam</title>",
    )
}

/// A file of the page by name: content type and text.
pub fn asset(_file: &str) -> Option<(&'static str, &'static str)> {
    None
}
