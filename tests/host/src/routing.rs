//! HTTP route matching and Spin's per-request headers, following Spin 3.x
//! (`spin@v3.6.3:crates/http/src/routes.rs`, which builds on the
//! `routefinder` crate, and `crates/trigger-http/src/headers.rs`).
//!
//! Route patterns:
//! - `/exact/path` matches that path, and also that path with one trailing
//!   slash (routefinder ignores a trailing `/`);
//! - `/prefix/...` matches `/prefix` itself and anything below it;
//! - `:name` matches one non-empty path segment and is exposed to the
//!   component as the `spin-path-match-<name>` header.
//!
//! When several routes match, the most specific wins: segments are compared
//! left to right, an exact segment beats a `:param`, which beats the trailing
//! wildcard; so an exact route beats a wildcard one and the longest wildcard
//! prefix wins. A route repeated in the manifest is overridden by its last
//! occurrence, as in Spin. No match gives a 404. `{ private = true }` routes
//! are not routable (such components are reached only by service chaining,
//! which uses [`Route::synthetic`]).
//!
//! Deviation: this is a re-implementation of routefinder's ordering for the
//! patterns above (exact, `:param`, trailing `/...`); routefinder's `*`,
//! `.`-separated and optional-segment syntax is not supported and is
//! rejected when the router is built.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};

use crate::manifest::{HttpTrigger, TriggerRoute};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Exact(String),
    Param(String),
}

/// Params captured by a route, and the wildcard remainder if any.
type Captured = (Vec<(String, String)>, Option<String>);

/// One routable entry.
#[derive(Debug, Clone)]
pub struct Route {
    component_id: String,
    /// The route as written in the manifest.
    raw_route: String,
    /// The route combined with the (fixed, `/`) base.
    based_route: String,
    segments: Vec<Segment>,
    wildcard: bool,
}

impl Route {
    /// Parses a route pattern for `component_id`.
    pub fn parse(component_id: &str, raw_route: &str) -> anyhow::Result<Self> {
        let based_route = sanitize_with_base(raw_route);
        let (pattern, wildcard) = match based_route.strip_suffix("/...") {
            Some(prefix) => (prefix.to_string(), true),
            None if based_route == "..." => (String::new(), true),
            None => (based_route.clone(), false),
        };
        let mut segments = Vec::new();
        for seg in pattern.split('/').filter(|s| !s.is_empty()) {
            if seg == "..." || seg.contains('*') || seg.contains('[') || seg.contains(']') {
                bail!("route {raw_route:?}: wildcards are only supported as a trailing `/...`");
            }
            if let Some(name) = seg.strip_prefix(':') {
                if name.is_empty() || name.contains(':') || name.contains('.') {
                    bail!("route {raw_route:?}: invalid parameter segment {seg:?}");
                }
                segments.push(Segment::Param(name.to_string()));
            } else {
                if seg.contains(':') {
                    bail!("route {raw_route:?}: `:` is only supported at the start of a segment");
                }
                segments.push(Segment::Exact(seg.to_string()));
            }
        }
        Ok(Route {
            component_id: component_id.to_string(),
            raw_route: raw_route.to_string(),
            based_route,
            segments,
            wildcard,
        })
    }

    /// The route Spin pretends matched a service chaining request
    /// (`RouteMatch::synthetic` in `spin@v3.6.x:crates/http/src/routes.rs`):
    /// the wildcard `/...` for `component_id`, whatever the component's
    /// real routes are (or even if it only has a private one).
    pub fn synthetic(component_id: &str) -> Self {
        Route {
            component_id: component_id.to_string(),
            raw_route: "/...".to_string(),
            based_route: "/...".to_string(),
            segments: Vec::new(),
            wildcard: true,
        }
    }

    /// The component this route maps to.
    pub fn component_id(&self) -> &str {
        &self.component_id
    }

    /// The route as written in the manifest.
    pub fn raw_route(&self) -> &str {
        &self.raw_route
    }

    /// True for a trailing-wildcard (`/...`) route.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }

    /// How Spin prints the route at startup: the based route, with a
    /// trailing `/...` replaced by ` (wildcard)`.
    pub fn display_route(&self) -> String {
        match self.based_route.strip_suffix("/...") {
            Some(prefix) => format!("{prefix} (wildcard)"),
            None => self.based_route.clone(),
        }
    }

    /// Tries to match `path`; returns captured params and, for wildcard
    /// routes, the raw remainder (without leading and trailing slashes).
    fn try_match(&self, path: &str) -> Option<Captured> {
        let trimmed = path.strip_prefix('/').unwrap_or(path);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        let mut rest = trimmed;
        let mut captures = Vec::new();
        for seg in &self.segments {
            if rest.is_empty() {
                return None;
            }
            let (head, tail) = match rest.split_once('/') {
                Some((h, t)) => (h, Some(t)),
                None => (rest, None),
            };
            match seg {
                Segment::Exact(e) if e == head => {}
                Segment::Exact(_) => return None,
                Segment::Param(name) => {
                    if head.is_empty() {
                        return None;
                    }
                    captures.push((name.clone(), head.to_string()));
                }
            }
            match tail {
                Some(t) => {
                    if t.is_empty() {
                        // A double slash: treat as non-matching segment boundary.
                        return None;
                    }
                    rest = t;
                }
                None => rest = "",
            }
        }
        if self.wildcard {
            Some((captures, Some(rest.to_string())))
        } else if rest.is_empty() {
            Some((captures, None))
        } else {
            None
        }
    }

    /// Specificity ordering: `Greater` means more specific.
    fn specificity_cmp(&self, other: &Route) -> std::cmp::Ordering {
        use std::cmp::Ordering::*;
        fn rank(s: Option<&Segment>, wildcard: bool) -> u8 {
            match s {
                Some(Segment::Exact(_)) => 3,
                Some(Segment::Param(_)) => 2,
                None if wildcard => 1,
                None => 0,
            }
        }
        let n = self.segments.len().max(other.segments.len());
        for i in 0..n {
            let a = rank(self.segments.get(i), self.wildcard);
            let b = rank(other.segments.get(i), other.wildcard);
            match a.cmp(&b) {
                Equal => {}
                o => {
                    // Past the end of one route: an exact (non-wildcard)
                    // route that matched the same path is more specific
                    // than a wildcard that would continue.
                    if a == 0 || b == 0 {
                        return if a == 0 { Greater } else { Less };
                    }
                    return o;
                }
            }
        }
        match (self.wildcard, other.wildcard) {
            (false, true) => Greater,
            (true, false) => Less,
            _ => Equal,
        }
    }
}

/// The result of routing a request path.
#[derive(Debug, Clone)]
pub struct RouteMatch<'r> {
    route: &'r Route,
    captures: Vec<(String, String)>,
    path_info: String,
}

impl<'r> RouteMatch<'r> {
    /// A match of `route` (normally [`Route::synthetic`]) for a service
    /// chaining request to `path`: as in Spin, the whole request path is
    /// the path info (it is not made relative to any route of the target)
    /// and there are no named captures.
    pub fn synthetic(route: &'r Route, path: &str) -> Self {
        RouteMatch {
            route,
            captures: Vec::new(),
            path_info: path.to_string(),
        }
    }

    /// The component that handles the request.
    pub fn component_id(&self) -> &str {
        &self.route.component_id
    }

    /// The matched route as written in the manifest.
    pub fn raw_route(&self) -> &str {
        &self.route.raw_route
    }

    /// The matched route combined with the base (`spin-matched-route`).
    pub fn based_route(&self) -> &str {
        &self.route.based_route
    }

    /// The raw route without a trailing `/...` (`spin-component-route`).
    pub fn raw_route_or_prefix(&self) -> &str {
        self.route
            .raw_route
            .strip_suffix("/...")
            .unwrap_or(&self.route.raw_route)
    }

    /// `:name` captures, in route order.
    pub fn named_wildcards(&self) -> &[(String, String)] {
        &self.captures
    }

    /// The part of the path matched by a trailing wildcard
    /// (`spin-path-info`); empty for exact routes.
    pub fn path_info(&self) -> &str {
        &self.path_info
    }
}

/// Routes request paths to components.
#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    /// Builds a router from the manifest's HTTP triggers. Private triggers
    /// are skipped; a repeated route keeps its last occurrence.
    pub fn build(triggers: &[HttpTrigger]) -> anyhow::Result<Self> {
        let mut routes: Vec<Route> = Vec::new();
        for trigger in triggers {
            let TriggerRoute::Route(raw) = &trigger.route else {
                continue;
            };
            let route = Route::parse(&trigger.component, raw)
                .with_context(|| format!("route of component {:?}", trigger.component))?;
            if let Some(existing) = routes.iter_mut().find(|r| r.raw_route == route.raw_route) {
                eprintln!(
                    "warning: duplicate route {:?}: component {:?} replaces {:?}, as in Spin",
                    route.raw_route, route.component_id, existing.component_id
                );
                *existing = route;
            } else {
                routes.push(route);
            }
        }
        Ok(Router { routes })
    }

    /// The routes, in manifest order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Routes `path` (the request URI's path, undecoded) to the most
    /// specific matching route.
    pub fn route(&self, path: &str) -> Option<RouteMatch<'_>> {
        let mut best: Option<(&Route, Captured)> = None;
        for route in &self.routes {
            let Some(captured) = route.try_match(path) else {
                continue;
            };
            let better = match &best {
                None => true,
                Some((b, _)) => route.specificity_cmp(b) == std::cmp::Ordering::Greater,
            };
            if better {
                best = Some((route, captured));
            }
        }
        let (route, (captures, rest)) = best?;
        let path_info = match rest {
            None => String::new(),
            Some(s) => match (s.is_empty(), path.ends_with('/')) {
                (true, false) => String::new(),
                (true, true) => "/".to_string(),
                (false, false) => format!("/{s}"),
                (false, true) => format!("/{s}/"),
            },
        };
        Some(RouteMatch {
            route,
            captures,
            path_info,
        })
    }
}

/// Spin's `sanitize_with_base("/", route)`: make the route absolute and strip
/// one trailing slash.
fn sanitize_with_base(route: &str) -> String {
    let abs = if route.starts_with('/') {
        route.to_string()
    } else {
        format!("/{route}")
    };
    match abs.strip_suffix('/') {
        Some(s) => s.to_string(),
        None => abs,
    }
}

/// Computes the `spin-*` headers Spin adds to a request routed to a
/// component (values as in `spin@v3.6.3:crates/trigger-http/src/headers.rs`).
///
/// `scheme` and `authority` are the request's (Spin uses the server's
/// scheme and the `Host` header), `path_and_query` the request target.
pub fn spin_headers(
    route_match: &RouteMatch<'_>,
    scheme: &str,
    authority: &str,
    path_and_query: &str,
    client_addr: SocketAddr,
) -> Vec<(String, String)> {
    let mut headers = vec![
        (
            "spin-path-info".to_string(),
            route_match.path_info().to_string(),
        ),
        (
            "spin-full-url".to_string(),
            format!("{scheme}://{authority}{path_and_query}"),
        ),
        (
            "spin-matched-route".to_string(),
            route_match.based_route().to_string(),
        ),
        ("spin-base-path".to_string(), "/".to_string()),
        (
            "spin-raw-component-route".to_string(),
            route_match.raw_route().to_string(),
        ),
        (
            "spin-component-route".to_string(),
            route_match.raw_route_or_prefix().to_string(),
        ),
        ("spin-client-addr".to_string(), client_addr.to_string()),
    ];
    for (name, value) in route_match.named_wildcards() {
        headers.push((
            format!("spin-path-match-{}", name.to_ascii_lowercase()),
            value.clone(),
        ));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(routes: &[(&str, &str)]) -> Router {
        let triggers: Vec<HttpTrigger> = routes
            .iter()
            .map(|(c, r)| HttpTrigger {
                id: None,
                route: TriggerRoute::Route(r.to_string()),
                component: c.to_string(),
            })
            .collect();
        Router::build(&triggers).unwrap()
    }

    fn component<'a>(r: &'a Router, path: &str) -> Option<&'a str> {
        r.route(path).map(|m| m.route.component_id.as_str())
    }

    #[test]
    fn exact_routes() {
        let r = router(&[("foo", "/foo"), ("foobar", "/foo/bar")]);
        assert_eq!(component(&r, "/foo"), Some("foo"));
        assert_eq!(component(&r, "/foo/bar"), Some("foobar"));
        assert_eq!(
            component(&r, "/foo/"),
            Some("foo"),
            "a trailing slash is ignored"
        );
        assert_eq!(component(&r, "/foo/baz"), None);
        assert_eq!(component(&r, "/fo"), None);
        assert_eq!(component(&r, "/"), None);
        assert_eq!(r.route("/foo").unwrap().path_info(), "");
    }

    #[test]
    fn wildcards_and_path_info() {
        let r = router(&[("all", "/...")]);
        for p in ["/foo/bar", "/abc/", "/", "/this/should/be/captured"] {
            assert_eq!(component(&r, p), Some("all"), "{p}");
        }
        assert_eq!(r.route("/1/2/3").unwrap().path_info(), "/1/2/3");

        let r = router(&[("t", "/test/...")]);
        assert_eq!(r.route("/test").unwrap().path_info(), "");
        assert_eq!(r.route("/test/").unwrap().path_info(), "/");
        assert_eq!(r.route("/test/hello").unwrap().path_info(), "/hello");
        assert_eq!(r.route("/test/hello/").unwrap().path_info(), "/hello/");
        assert!(
            r.route("/testing").is_none(),
            "wildcards match whole segments"
        );
    }

    #[test]
    fn longest_prefix_and_exact_win() {
        let orders = [
            vec![
                ("one", "/one/..."),
                ("two", "/one/two/..."),
                ("three", "/one/two/three/..."),
            ],
            vec![
                ("three", "/one/two/three/..."),
                ("two", "/one/two/..."),
                ("one", "/one/..."),
            ],
        ];
        for routes in orders {
            let r = router(&routes);
            assert_eq!(component(&r, "/one/two/three/four"), Some("three"));
            assert_eq!(component(&r, "/one/two/x"), Some("two"));
            assert_eq!(component(&r, "/one/two"), Some("two"));
            assert_eq!(component(&r, "/one"), Some("one"));
        }
        let r = router(&[("wild", "/..."), ("exact", "/one")]);
        assert_eq!(component(&r, "/one"), Some("exact"));
        assert_eq!(component(&r, "/two"), Some("wild"));
        let r = router(&[("prefix", "/v1/pools/..."), ("exact", "/v1/pools")]);
        assert_eq!(component(&r, "/v1/pools"), Some("exact"));
        assert_eq!(component(&r, "/v1/pools/"), Some("exact"));
        assert_eq!(component(&r, "/v1/pools/a"), Some("prefix"));
    }

    #[test]
    fn params() {
        let r = router(&[("c", "/1/:two/3")]);
        let m = r.route("/1/2/3").unwrap();
        assert_eq!(m.named_wildcards(), &[("two".to_string(), "2".to_string())]);
        assert!(r.route("/1//3").is_none());
        assert!(r.route("/1/2/4").is_none());

        let r = router(&[("c", "/1/:two/..."), ("exact", "/1/x/..."), ("p", "/:a/:b")]);
        let m = r.route("/1/2/3").unwrap();
        assert_eq!(m.component_id(), "c");
        assert_eq!(m.named_wildcards(), &[("two".to_string(), "2".to_string())]);
        assert_eq!(m.path_info(), "/3");
        assert_eq!(component(&r, "/1/x/3"), Some("exact"));
        assert_eq!(component(&r, "/9/8"), Some("p"));
        // A param beats the wildcard at the same position.
        assert_eq!(
            component(&r, "/1/2"),
            Some("c"),
            "both match; /1/:two/... vs /:a/:b tie-break by segment"
        );
    }

    #[test]
    fn duplicates_last_wins_and_private_skipped() {
        let triggers = vec![
            HttpTrigger {
                id: None,
                route: TriggerRoute::Route("/foo".into()),
                component: "first".into(),
            },
            HttpTrigger {
                id: None,
                route: TriggerRoute::Route("/foo".into()),
                component: "second".into(),
            },
            HttpTrigger {
                id: None,
                route: TriggerRoute::Private,
                component: "private".into(),
            },
        ];
        let r = Router::build(&triggers).unwrap();
        assert_eq!(r.routes().len(), 1);
        assert_eq!(component(&r, "/foo"), Some("second"));
    }

    #[test]
    fn unsupported_patterns() {
        assert!(Route::parse("c", "/a/*").is_err());
        assert!(Route::parse("c", "/a/.../b").is_err());
        assert!(Route::parse("c", "/a/b:c").is_err());
    }

    #[test]
    fn headers_match_spin() {
        let addr: SocketAddr = "127.0.0.1:8777".parse().unwrap();
        let r = router(&[("c", "/foo/...")]);
        let m = r.route("/foo/bar").unwrap();
        let h = spin_headers(
            &m,
            "https",
            "fermyon.dev",
            "/foo/bar?key1=value1&key2=value2",
            addr,
        );
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("spin-full-url"),
            Some("https://fermyon.dev/foo/bar?key1=value1&key2=value2")
        );
        assert_eq!(get("spin-path-info"), Some("/bar"));
        assert_eq!(get("spin-matched-route"), Some("/foo/..."));
        assert_eq!(get("spin-base-path"), Some("/"));
        assert_eq!(get("spin-raw-component-route"), Some("/foo/..."));
        assert_eq!(get("spin-component-route"), Some("/foo"));
        assert_eq!(get("spin-client-addr"), Some("127.0.0.1:8777"));

        let r = router(&[("c", "/foo/:userid/...")]);
        let m = r.route("/foo/42/bar").unwrap();
        let h = spin_headers(&m, "https", "fermyon.dev", "/foo/42/bar", addr);
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("spin-path-info"), Some("/bar"));
        assert_eq!(get("spin-matched-route"), Some("/foo/:userid/..."));
        assert_eq!(get("spin-component-route"), Some("/foo/:userid"));
        assert_eq!(get("spin-path-match-userid"), Some("42"));
    }

    #[test]
    fn synthetic_headers_match_spin_service_chaining() {
        // Spin's chained request: RouteMatch::synthetic(id, path), no Host
        // header (so "localhost" in the full URL) and client 0.0.0.0:0.
        let route = Route::synthetic("allocate");
        let m = RouteMatch::synthetic(&route, "/v1/pools/p/allocate");
        assert_eq!(m.component_id(), "allocate");
        let h = spin_headers(
            &m,
            "http",
            "localhost",
            "/v1/pools/p/allocate?x=1",
            "0.0.0.0:0".parse().unwrap(),
        );
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("spin-full-url"),
            Some("http://localhost/v1/pools/p/allocate?x=1")
        );
        assert_eq!(get("spin-path-info"), Some("/v1/pools/p/allocate"));
        assert_eq!(get("spin-matched-route"), Some("/..."));
        assert_eq!(get("spin-base-path"), Some("/"));
        assert_eq!(get("spin-raw-component-route"), Some("/..."));
        assert_eq!(get("spin-component-route"), Some(""));
        assert_eq!(get("spin-client-addr"), Some("0.0.0.0:0"));
        assert_eq!(h.len(), 7, "no spin-path-match-* headers");
    }

    #[test]
    fn display() {
        let r = router(&[("a", "/v1/pools/..."), ("b", "/healthz"), ("c", "/...")]);
        let shown: Vec<String> = r.routes().iter().map(|r| r.display_route()).collect();
        assert_eq!(
            shown,
            vec!["/v1/pools (wildcard)", "/healthz", " (wildcard)"]
        );
    }
}
