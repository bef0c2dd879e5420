//! `allowed_outbound_hosts` parsing and matching, as Spin does it
//! (`spin@v3.6.3:crates/outbound-networking-config/src/allowed_hosts.rs`).
//!
//! An entry is `scheme://host[:port]`:
//! - scheme: a word such as `http`/`https`, or `*`;
//! - host: a name or IP (exact, case-sensitive as Spin; request hosts are
//!   lower-cased), `*` (any), `*.example.com` (any subdomain), or a CIDR
//!   (`10.0.0.0/8`, matched against IP-literal hosts only);
//! - port: a number, `*`, a range `a..b` (end exclusive), or omitted for the
//!   scheme's well-known port (`http` 80, `https` 443, ...). A scheme without
//!   a well-known port (including `*`) requires an explicit port.
//!
//! `{{ variable }}` templates are resolved against application variables
//! before parsing. An empty list denies everything.
//!
//! Service chaining hosts need nothing special: `http://allocate.spin.internal`
//! is an exact host and `http://*.spin.internal` a subdomain wildcard, matched
//! like any other entry (scheme and port included), as in Spin. Whether a
//! request *is* a chained request is decided from its URL alone by
//! [`parse_service_chaining_target`].
//!
//! Not supported (rejected with an error): `self` / `self.alt` (requests by
//! route to the application itself) and `insecure:allow-all` (also rejected
//! by Spin).

use std::net::IpAddr;
use std::ops::Range;

use anyhow::{bail, ensure, Context as _};

use crate::variables::{AppVariables, Template};

/// One parsed `allowed_outbound_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    original: String,
    scheme: Option<String>,
    host: HostPattern,
    port: PortPattern,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    AnySubdomain(String),
    Exact(String),
    Cidr(IpAddr, u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PortPattern {
    Any,
    Port(u16),
    Range(Range<u16>),
}

fn well_known_port(scheme: &str) -> Option<u16> {
    match scheme {
        "postgres" => Some(5432),
        "mysql" => Some(3306),
        "redis" => Some(6379),
        "mqtt" => Some(1883),
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = text.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((ip, prefix))
}

fn cidr_contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            (u32::from(n) & mask) == (u32::from(i) & mask)
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            (u128::from(n) & mask) == (u128::from(i) & mask)
        }
        _ => false,
    }
}

impl AllowedHost {
    /// Parses one literal (template-free) entry.
    pub fn parse(entry: &str) -> anyhow::Result<Self> {
        let url = entry.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            match url {
                "*" | ":" | "" | "?" => bail!(
                    "{url:?} is not an allowed outbound host format: hosts must be in the form <scheme>://<host>[:<port>], with '*' wildcards allowed for each"
                ),
                _ => bail!("{url:?} does not contain a scheme (e.g., 'http://' or '*://')"),
            }
        };
        let (host, rest) = rest.rsplit_once(':').unwrap_or((rest, ""));
        let port = match rest.split_once('/') {
            Some((port, path)) => {
                ensure!(path.is_empty(), "{url:?} has a path but is not allowed to");
                port
            }
            None => rest,
        };

        let scheme_opt = if scheme == "*" {
            None
        } else {
            ensure!(
                !scheme.is_empty() && scheme.chars().all(|c| c.is_alphabetic()),
                "scheme {scheme:?} contains non alphabetic character"
            );
            Some(scheme.to_string())
        };

        let host = host.trim();
        let host_pattern = if host == "*" {
            HostPattern::Any
        } else if host == "self" || host == "self.alt" {
            bail!("{url:?}: requests to `self` (relative URLs and `self.alt`) are not supported by this host; use service chaining (`http://<component-id>.spin.internal`) instead")
        } else if host.starts_with('{') {
            bail!("{url:?}: host lists are not yet supported")
        } else if let Some((ip, prefix)) = parse_cidr(host) {
            HostPattern::Cidr(ip, prefix)
        } else {
            if matches!(host.split('/').nth(1), Some(p) if !p.is_empty()) {
                bail!("{url:?}: hosts must not contain paths");
            }
            let host = host.trim_end_matches('/');
            if let Some(domain) = host.strip_prefix("*.") {
                ensure!(
                    !domain.contains('*'),
                    "Invalid allowed host {host}: wildcards are allowed only as prefixes"
                );
                HostPattern::AnySubdomain(format!(".{domain}"))
            } else {
                ensure!(
                    !host.contains('*'),
                    "Invalid allowed host {host}: wildcards are allowed only as subdomains"
                );
                ensure!(!host.is_empty(), "{url:?}: empty host");
                HostPattern::Exact(host.to_string())
            }
        };

        let port_pattern = if port.is_empty() {
            match well_known_port(scheme) {
                Some(p) => PortPattern::Port(p),
                None => bail!(
                    "{url:?}: no port was provided and the scheme {scheme:?} does not have a known default port number"
                ),
            }
        } else if port == "*" {
            PortPattern::Any
        } else if let Some((start, end)) = port.split_once("..") {
            let start: u16 = start
                .parse()
                .with_context(|| format!("port range {port:?} contains non-number"))?;
            let end: u16 = end
                .parse()
                .with_context(|| format!("port range {port:?} contains non-number"))?;
            PortPattern::Range(start..end)
        } else {
            PortPattern::Port(
                port.parse()
                    .with_context(|| format!("port {port:?} is not a number"))?,
            )
        };

        Ok(AllowedHost {
            original: entry.to_string(),
            scheme: scheme_opt,
            host: host_pattern,
            port: port_pattern,
        })
    }

    /// Whether a request to `scheme://host[:port]` is allowed by this entry.
    /// `port` is the explicit port of the URL, if any.
    pub fn allows(&self, scheme: &str, host: &str, port: Option<u16>) -> bool {
        if let Some(s) = &self.scheme {
            if s != scheme {
                return false;
            }
        }
        let host_ok = match &self.host {
            HostPattern::Any => true,
            HostPattern::AnySubdomain(suffix) => host.ends_with(suffix.as_str()),
            HostPattern::Exact(h) => h == host,
            HostPattern::Cidr(net, prefix) => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                match bare.parse::<IpAddr>() {
                    Ok(ip) => cidr_contains(*net, *prefix, ip),
                    Err(_) => false,
                }
            }
        };
        if !host_ok {
            return false;
        }
        match &self.port {
            PortPattern::Any => true,
            PortPattern::Port(p) => port.or_else(|| well_known_port(scheme)) == Some(*p),
            PortPattern::Range(r) => port
                .or_else(|| well_known_port(scheme))
                .is_some_and(|p| r.contains(&p)),
        }
    }

    /// The entry as written.
    pub fn original(&self) -> &str {
        &self.original
    }
}

/// The service chaining domain: requests to `<component-id>.spin.internal`
/// are handled in-process by that component.
pub const SERVICE_CHAINING_DOMAIN: &str = "spin.internal";

/// The component id a service chaining request is addressed to: the first
/// label of a host of the form `<id>.spin.internal` (any port ignored), or
/// `None` for any other host, including `spin.internal` itself and deeper
/// names such as `a.b.spin.internal`. The host is taken as written
/// (case-sensitive), as Spin does
/// (`spin@v3.6.x:crates/outbound-networking-config/src/allowed_hosts.rs`,
/// `parse_service_chaining_target`).
pub fn parse_service_chaining_target(uri: &http::Uri) -> Option<String> {
    let host = uri.authority().map(|a| a.host().trim())?;
    service_chaining_host_target(host)
}

/// Whether `host` (a `Host` header value or URL host, optionally with a
/// port) names a service chaining target.
pub fn is_service_chaining_host(host: &str) -> bool {
    service_chaining_host_target(host).is_some()
}

fn service_chaining_host_target(host: &str) -> Option<String> {
    let (host, _) = host.rsplit_once(':').unwrap_or((host, ""));
    let (first, rest) = host.split_once('.')?;
    (rest == SERVICE_CHAINING_DOMAIN).then(|| first.to_string())
}

/// A component's resolved `allowed_outbound_hosts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHostsConfig {
    hosts: Vec<AllowedHost>,
}

impl AllowedHostsConfig {
    /// Validates entries at manifest load time: literal entries must parse;
    /// templated entries are checked after resolution.
    pub fn validate(entries: &[String]) -> anyhow::Result<()> {
        if entries.len() == 1 && entries[0] == "insecure:allow-all" {
            bail!("'insecure:allow-all' is not allowed - use '*://*:*' instead if you really want to allow all outbound traffic");
        }
        for entry in entries {
            let template = Template::parse(entry)?;
            if template.is_literal() {
                AllowedHost::parse(entry)?;
            }
        }
        Ok(())
    }

    /// Resolves templates against the application variables and parses.
    pub fn resolve(entries: &[String], vars: &AppVariables) -> anyhow::Result<Self> {
        Self::validate(entries)?;
        let mut hosts = Vec::new();
        for entry in entries {
            let template = Template::parse(entry)?;
            let resolved = vars.resolve_template(&template)?;
            hosts.push(
                AllowedHost::parse(&resolved)
                    .with_context(|| format!("allowed_outbound_hosts entry {entry:?}"))?,
            );
        }
        Ok(AllowedHostsConfig { hosts })
    }

    /// Parses literal entries (no templates).
    pub fn parse_literal(entries: &[&str]) -> anyhow::Result<Self> {
        let owned: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        Self::resolve(&owned, &AppVariables::default())
    }

    /// Whether an outbound request to `uri` is allowed. The host is compared
    /// lower-cased (as Spin's URL parsing does); a URI without a scheme or a
    /// host is denied.
    pub fn allows_uri(&self, uri: &http::Uri) -> bool {
        let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        let host = host.to_ascii_lowercase();
        self.hosts
            .iter()
            .any(|h| h.allows(&scheme, &host, uri.port_u16()))
    }

    /// True when no entry is configured (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(entries: &[&str], url: &str) -> bool {
        let cfg = AllowedHostsConfig::parse_literal(entries).unwrap();
        cfg.allows_uri(&url.parse().unwrap())
    }

    #[test]
    fn exact_hosts_and_default_ports() {
        let e = ["https://api.equinix.com"];
        assert!(allows(&e, "https://api.equinix.com/metal/v1/projects"));
        assert!(allows(&e, "https://api.equinix.com:443/x"));
        assert!(allows(&e, "https://API.Equinix.com/x"));
        assert!(!allows(&e, "http://api.equinix.com/x"));
        assert!(!allows(&e, "https://api.equinix.com:8443/x"));
        assert!(!allows(&e, "https://evil.api.equinix.com/x"));
        assert!(!allows(&e, "https://api.equinix.com.evil.io/x"));
        let e = ["http://127.0.0.1:8080"];
        assert!(allows(&e, "http://127.0.0.1:8080/"));
        assert!(!allows(&e, "http://127.0.0.1/"));
        assert!(!allows(&e, "http://localhost:8080/"));
    }

    #[test]
    fn wildcards_ports_and_cidrs() {
        assert!(allows(&["https://*"], "https://anything.example/x"));
        assert!(!allows(&["https://*"], "https://anything.example:444/x"));
        assert!(allows(&["*://*:*"], "http://x:1/"));
        assert!(allows(&["http://*.example.com"], "http://a.b.example.com/"));
        assert!(!allows(&["http://*.example.com"], "http://example.com/"));
        assert!(allows(&["http://localhost:*"], "http://localhost:12345/"));
        assert!(allows(
            &["http://localhost:8000..8010"],
            "http://localhost:8009/"
        ));
        assert!(!allows(
            &["http://localhost:8000..8010"],
            "http://localhost:8010/"
        ));
        assert!(allows(&["http://127.0.0.0/8:*"], "http://127.1.2.3:9/"));
        assert!(!allows(&["http://10.0.0.0/8:*"], "http://127.1.2.3:9/"));
        assert!(allows(&["http://[::1]:80"], "http://[::1]/"));
    }

    #[test]
    fn empty_list_denies_all() {
        let cfg = AllowedHostsConfig::default();
        assert!(cfg.is_empty());
        assert!(!cfg.allows_uri(&"http://127.0.0.1/".parse().unwrap()));
        // A relative URI has no host: denied.
        assert!(!allows(&["*://*:*"], "/relative"));
    }

    #[test]
    fn bad_entries() {
        for bad in [
            "example.com",
            "*",
            "https://example.com/path",
            "*://example.com",
            "ht3p://x",
            "https://a.*.com",
            "https://x:notaport",
            "http://self",
            "https://self.alt",
            "insecure:allow-all",
        ] {
            assert!(
                AllowedHostsConfig::parse_literal(&[bad]).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn service_chaining_hosts_are_ordinary_entries() {
        let e = ["http://allocate.spin.internal"];
        assert!(allows(&e, "http://allocate.spin.internal/v1/x?y=1"));
        assert!(allows(&e, "http://allocate.spin.internal:80/"));
        assert!(!allows(&e, "https://allocate.spin.internal/"), "scheme");
        assert!(!allows(&e, "http://allocate.spin.internal:8080/"), "port");
        assert!(!allows(&e, "http://release.spin.internal/"));
        let e = ["http://*.spin.internal"];
        assert!(allows(&e, "http://allocate.spin.internal/"));
        assert!(allows(&e, "http://release.spin.internal/"));
        assert!(!allows(&e, "http://spin.internal/"));
        assert!(!allows(&e, "https://allocate.spin.internal/"));
        let e = ["*://*.spin.internal:*"];
        assert!(allows(&e, "https://allocate.spin.internal:9/"));
    }

    #[test]
    fn service_chaining_targets() {
        let target = |u: &str| parse_service_chaining_target(&u.parse().unwrap());
        assert_eq!(
            target("http://allocate.spin.internal/v1"),
            Some("allocate".into())
        );
        assert_eq!(
            target("https://allocate.spin.internal:8443/"),
            Some("allocate".into())
        );
        assert_eq!(target("http://spin.internal/"), None);
        assert_eq!(target("http://a.b.spin.internal/"), None);
        assert_eq!(target("http://allocate.spin.internal.evil.io/"), None);
        assert_eq!(target("http://127.0.0.1:3000/"), None);
        assert_eq!(target("/relative"), None);
        // Case-sensitive, as in Spin: not a component id.
        assert_eq!(
            target("http://Allocate.spin.internal/"),
            Some("Allocate".into())
        );
        assert!(is_service_chaining_host("events.spin.internal:1234"));
        assert!(!is_service_chaining_host("localhost:3000"));
    }

    #[test]
    fn templates_resolve_against_app_variables() {
        let manifest = crate::manifest::AppManifest::parse(
            "spin_manifest_version = 2\n[application]\nname = \"t\"\n[variables]\nk8s_host = { default = \"10.0.0.1:6443\" }\n",
            std::path::Path::new("spin.toml"),
            std::path::Path::new("."),
        )
        .unwrap();
        let vars = AppVariables::resolve(&manifest, &[], |_| None).unwrap();
        let cfg =
            AllowedHostsConfig::resolve(&["https://{{ k8s_host }}".to_string()], &vars).unwrap();
        assert!(cfg.allows_uri(&"https://10.0.0.1:6443/api".parse().unwrap()));
        assert!(!cfg.allows_uri(&"https://10.0.0.1/api".parse().unwrap()));
    }
}
