//! Application and component variables (`fermyon:spin/variables@2.0.0`).
//!
//! Values of application variables come from, highest precedence first:
//! 1. explicit values (`--variable name=value`, [`crate::HostBuilder::variable`]);
//! 2. the environment variable `SPIN_VARIABLE_<UPPER_NAME>` (read once, when
//!    the host is built);
//! 3. the `default` in `[variables]`.
//!
//! A `required` variable without a value is a startup error naming it. A
//! component sees only the variables listed in its
//! `[component.<id>.variables]` table, whose values are templates such as
//! `"Bearer {{ api_token }}"` resolved against the application variables.
//! Names and error messages follow `spin@v3.6.3:crates/expressions`.
//!
//! Deviation from Spin: values are resolved once at startup (Spin asks its
//! providers on every `get`), and Spin's `.env` file support and
//! Vault/Azure providers are not implemented.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Context as _};

use crate::manifest::AppManifest;

/// Validates a variable name the way Spin does (`spin_expressions::Key`):
/// lower-case ASCII letters, digits and single underscores, starting with a
/// letter and ending with a letter or digit.
pub fn validate_variable_name(key: &str) -> Result<(), String> {
    let reason = if key.is_empty() {
        "must not be empty".to_string()
    } else if let Some(invalid) = key
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        format!("invalid character {invalid:?}. Variable names may contain only lower-case letters, numbers, and underscores.")
    } else if !key.starts_with(|c: char| c.is_ascii_lowercase()) {
        "must start with a lowercase ASCII letter".to_string()
    } else if !key.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        "must end with a lowercase ASCII letter or digit".to_string()
    } else if key.contains("__") {
        "must not contain multiple consecutive underscores".to_string()
    } else {
        return Ok(());
    };
    Err(format!("{key:?}: {reason}"))
}

/// A string template with `{{ variable }}` expressions (Spin's
/// `spin_expressions::Template`: no escaping, whitespace inside the braces
/// is trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Expr(String),
}

impl Template {
    /// Parses a template. Fails on an unmatched `{{`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{{") {
                let Some((expr, tail)) = after.split_once("}}") else {
                    bail!("invalid variable template: unmatched '{{{{' in template {text:?}");
                };
                parts.push(Part::Expr(expr.trim().to_string()));
                rest = tail;
            } else if let Some(idx) = rest.find("{{") {
                parts.push(Part::Lit(rest[..idx].to_string()));
                rest = &rest[idx..];
            } else {
                parts.push(Part::Lit(rest.to_string()));
                rest = "";
            }
        }
        Ok(Template { parts })
    }

    /// True when the template contains no expressions.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The variable names referenced by the template's expressions.
    pub fn referenced_variables(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Expr(e) => Some(e.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// Substitutes every expression with `lookup(name)`; fails on a name the
    /// lookup does not know.
    pub fn resolve(&self, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Lit(l) => out.push_str(l),
                Part::Expr(e) => match lookup(e) {
                    Some(v) => out.push_str(&v),
                    None => bail!("invalid variable name: {e:?}"),
                },
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Lit(l) => f.write_str(l)?,
                Part::Expr(e) => write!(f, "{{{{ {e} }}}}")?,
            }
        }
        Ok(())
    }
}

/// Where an application variable's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableSource {
    /// An explicit value (`--variable`, [`crate::HostBuilder::variable`]).
    Explicit,
    /// `SPIN_VARIABLE_<NAME>` in the environment.
    Environment,
    /// The manifest default.
    Default,
}

/// A resolved application variable.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedVariable {
    /// The value.
    pub value: String,
    /// Whether the manifest marks it `secret`.
    pub secret: bool,
    /// Where the value came from.
    pub source: VariableSource,
}

impl fmt::Debug for ResolvedVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedVariable")
            .field("value", &self.display_value())
            .field("secret", &self.secret)
            .field("source", &self.source)
            .finish()
    }
}

impl ResolvedVariable {
    /// The value for display: `<secret>` for secret variables.
    pub fn display_value(&self) -> &str {
        if self.secret {
            "<secret>"
        } else {
            &self.value
        }
    }
}

/// The name of the environment variable that supplies application variable
/// `name` (`SPIN_VARIABLE_<UPPER_NAME>`).
pub fn env_var_name(name: &str) -> String {
    format!("SPIN_VARIABLE_{}", name.to_ascii_uppercase())
}

/// All application variables with their resolved values.
#[derive(Debug, Clone, Default)]
pub struct AppVariables {
    values: BTreeMap<String, ResolvedVariable>,
}

impl AppVariables {
    /// Resolves the manifest's application variables.
    ///
    /// `explicit` values win over `env` (a lookup of environment variables
    /// by their full name, e.g. `SPIN_VARIABLE_API_TOKEN`), which wins over
    /// manifest defaults. Fails on an explicit value for an undeclared
    /// variable and, naming all of them, on required variables without a
    /// value.
    pub fn resolve(
        manifest: &AppManifest,
        explicit: &[(String, String)],
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        for (name, _) in explicit {
            if manifest.variable(name).is_none() {
                bail!("variable {name:?} is not declared in the manifest's [variables]");
            }
        }
        let mut values = BTreeMap::new();
        let mut missing = Vec::new();
        for (name, def) in &manifest.variables {
            let explicit_value = explicit
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone());
            let resolved = if let Some(v) = explicit_value {
                Some((v, VariableSource::Explicit))
            } else if let Some(v) = env(&env_var_name(name)) {
                Some((v, VariableSource::Environment))
            } else {
                def.default.clone().map(|v| (v, VariableSource::Default))
            };
            match resolved {
                Some((value, source)) => {
                    values.insert(
                        name.clone(),
                        ResolvedVariable {
                            value,
                            secret: def.secret,
                            source,
                        },
                    );
                }
                None => missing.push(name.clone()),
            }
        }
        if !missing.is_empty() {
            let hints: Vec<String> = missing
                .iter()
                .map(|n| format!("{n} (set {} or pass --variable {n}=...)", env_var_name(n)))
                .collect();
            bail!(
                "required application variable(s) without a value: {}",
                hints.join(", ")
            );
        }
        Ok(AppVariables { values })
    }

    /// A resolved variable by name.
    pub fn get(&self, name: &str) -> Option<&ResolvedVariable> {
        self.values.get(name)
    }

    /// All variables, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ResolvedVariable)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Resolves a template against these variables.
    pub fn resolve_template(&self, template: &Template) -> anyhow::Result<String> {
        template.resolve(|n| self.values.get(n).map(|v| v.value.clone()))
    }
}

/// The variables one component can read, already resolved.
#[derive(Clone, Default)]
pub struct ComponentVariables {
    component_id: String,
    values: BTreeMap<String, String>,
}

impl fmt::Debug for ComponentVariables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComponentVariables")
            .field("component_id", &self.component_id)
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The error of a component's `variables.get`, mirroring
/// `fermyon:spin/variables@2.0.0`'s `error` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VariableError {
    /// The name is not a valid variable name.
    InvalidName(String),
    /// The component has no such variable.
    Undefined(String),
}

impl ComponentVariables {
    /// Resolves the component's variable templates.
    pub fn resolve(
        component_id: &str,
        templates: &[(String, Template)],
        app: &AppVariables,
    ) -> anyhow::Result<Self> {
        let mut values = BTreeMap::new();
        for (name, template) in templates {
            let value = app
                .resolve_template(template)
                .with_context(|| format!("component {component_id:?} variable {name:?}"))?;
            values.insert(name.clone(), value);
        }
        Ok(ComponentVariables {
            component_id: component_id.to_string(),
            values,
        })
    }

    /// `variables.get(name)` as a component sees it, with Spin's messages.
    pub fn get(&self, name: &str) -> Result<String, VariableError> {
        validate_variable_name(name)
            .map_err(|e| VariableError::InvalidName(format!("invalid variable name: {e}")))?;
        self.values.get(name).cloned().ok_or_else(|| {
            VariableError::Undefined(format!(
                "no variable for {:?}.{:?}",
                self.component_id, name
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn manifest() -> AppManifest {
        AppManifest::parse(
            r#"
spin_manifest_version = 2
[application]
name = "t"
[variables]
api_token = { required = true, secret = true }
mode = { default = "auto" }
other = { default = "o" }
[[trigger.http]]
route = "/..."
component = "c"
[component.c]
source = "c.wasm"
[component.c.variables]
api_token = "Bearer {{ api_token }}"
kv_mode = "{{mode}}-{{ other }}"
[component.d]
source = "d.wasm"
"#,
            Path::new("spin.toml"),
            Path::new("."),
        )
        .unwrap()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn names() {
        for good in ["a", "abc", "a1b2c3", "a_1", "a_1_b_3", "api_token"] {
            assert!(validate_variable_name(good).is_ok(), "{good}");
        }
        for bad in ["", "aX", "1bc", "_x", "x.y", "x_", "a__b", "x-y"] {
            assert!(validate_variable_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn templates() {
        let t = Template::parse("a-{{ x }}-{{y}}{{ z }}").unwrap();
        assert_eq!(
            t.referenced_variables().collect::<Vec<_>>(),
            vec!["x", "y", "z"]
        );
        assert!(!t.is_literal());
        assert!(Template::parse("plain").unwrap().is_literal());
        assert_eq!(t.resolve(|n| Some(n.to_uppercase())).unwrap(), "a-X-YZ");
        assert!(Template::parse("{{ x }} {{ open").is_err());
        assert_eq!(Template::parse("").unwrap().resolve(|_| None).unwrap(), "");
    }

    #[test]
    fn precedence_explicit_env_default() {
        let m = manifest();
        let env = |k: &str| match k {
            "SPIN_VARIABLE_API_TOKEN" => Some("from-env".to_string()),
            "SPIN_VARIABLE_MODE" => Some("env-mode".to_string()),
            _ => None,
        };
        let vars = AppVariables::resolve(&m, &[], env).unwrap();
        assert_eq!(vars.get("api_token").unwrap().value, "from-env");
        assert_eq!(
            vars.get("api_token").unwrap().source,
            VariableSource::Environment
        );
        assert_eq!(vars.get("mode").unwrap().value, "env-mode");
        assert_eq!(vars.get("other").unwrap().value, "o");
        assert_eq!(vars.get("other").unwrap().source, VariableSource::Default);

        let explicit = vec![("api_token".to_string(), "cli".to_string())];
        let vars = AppVariables::resolve(&m, &explicit, env).unwrap();
        assert_eq!(vars.get("api_token").unwrap().value, "cli");
        assert_eq!(
            vars.get("api_token").unwrap().source,
            VariableSource::Explicit
        );
        // Secret values never show up in Debug output.
        assert!(!format!("{vars:?}").contains("cli"));
        assert_eq!(vars.get("api_token").unwrap().display_value(), "<secret>");
    }

    #[test]
    fn missing_required_and_unknown_explicit() {
        let m = manifest();
        let err = AppVariables::resolve(&m, &[], no_env)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("api_token") && err.contains("SPIN_VARIABLE_API_TOKEN"),
            "{err}"
        );
        let explicit = vec![
            ("api_token".to_string(), "t".to_string()),
            ("nope".to_string(), "x".to_string()),
        ];
        let err = AppVariables::resolve(&m, &explicit, no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn component_scoping() {
        let m = manifest();
        let explicit = vec![("api_token".to_string(), "s3cr3t".to_string())];
        let app = AppVariables::resolve(&m, &explicit, no_env).unwrap();
        let c = m.component("c").unwrap();
        let vars = ComponentVariables::resolve("c", &c.variables, &app).unwrap();
        assert_eq!(vars.get("api_token").unwrap(), "Bearer s3cr3t");
        assert_eq!(vars.get("kv_mode").unwrap(), "auto-o");
        // App variables not listed for the component are invisible.
        assert!(matches!(vars.get("mode"), Err(VariableError::Undefined(_))));
        assert!(matches!(
            vars.get("Bad"),
            Err(VariableError::InvalidName(_))
        ));
        assert!(!format!("{vars:?}").contains("s3cr3t"));
        let d =
            ComponentVariables::resolve("d", &m.component("d").unwrap().variables, &app).unwrap();
        assert!(matches!(
            d.get("api_token"),
            Err(VariableError::Undefined(_))
        ));
    }
}
