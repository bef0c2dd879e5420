//! Kubernetes name rules, checked before a name becomes part of a key.
//!
//! Names end up inside key-value keys (`claim/<namespace>/<name>`), so they
//! are validated strictly: a `/` or an empty segment could otherwise alias
//! another object's key.

/// Checks a DNS-1123 subdomain (object names): at most 253 characters of
/// lower-case alphanumerics, `-` and `.`, starting and ending alphanumeric.
///
/// # Errors
/// A message saying what is wrong.
///
/// # Examples
/// ```
/// use metal_ipam_core::kube::names::check_subdomain;
/// assert!(check_subdomain("worker-0.example").is_ok());
/// assert!(check_subdomain("Worker").is_err());
/// assert!(check_subdomain("a/b").is_err());
/// assert!(check_subdomain("").is_err());
/// ```
pub fn check_subdomain(name: &str) -> Result<(), String> {
    check(name, 253, true)
}

/// Checks a DNS-1123 label (namespaces): at most 63 characters of
/// lower-case alphanumerics and `-`, starting and ending alphanumeric.
///
/// # Errors
/// A message saying what is wrong.
///
/// # Examples
/// ```
/// use metal_ipam_core::kube::names::check_label;
/// assert!(check_label("team-a").is_ok());
/// assert!(check_label("team.a").is_err());
/// ```
pub fn check_label(name: &str) -> Result<(), String> {
    check(name, 63, false)
}

fn check(name: &str, max: usize, dots: bool) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > max {
        return Err(format!("{name:?} is longer than {max} characters"));
    }
    let ok_char =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.');
    if !name.chars().all(ok_char) {
        return Err(format!(
            "{name:?} must consist of lower-case letters, digits, '-'{}",
            if dots { " and '.'" } else { "" }
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err(format!(
            "{name:?} must start and end with a letter or digit"
        ));
    }
    if dots && name.split('.').any(str::is_empty) {
        return Err(format!("{name:?} has an empty dot-separated part"));
    }
    Ok(())
}
