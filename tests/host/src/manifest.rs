//! Loading and validating a Spin manifest (`spin.toml`, manifest version 2).
//!
//! Only the subset of the manifest that metal-ipam uses is supported. Anything
//! else is rejected with an error naming the offending key, rather than
//! silently ignored, so a manifest that this host accepts behaves the same on
//! Spin.
//!
//! Supported:
//! - `spin_manifest_version = 2`;
//! - `[application]`: `name` (required), `version`, `description`, `authors`,
//!   `targets`, `[application.tool.*]` (ignored, as Spin does);
//! - `[variables]`: `name = { default = "..." }` or `{ required = true }`,
//!   optional `secret` and `description`;
//! - `[[trigger.http]]`: `route` (a string, or `{ private = true }`),
//!   `component` (a component id), optional `id`, optional
//!   `executor = { type = "http" }`;
//! - `[component.<id>]`: `source` (a local path), `description`, `variables`,
//!   `environment`, `allowed_outbound_hosts`, `key_value_stores`, `build`
//!   (`command`, `workdir`, `watch`), `tool` (ignored).
//!
//! Rejected: other trigger types, inline components, `static_response`,
//! Wagi executors, remote or registry sources, `files`, `exclude_files`,
//! `allowed_http_hosts`, `sqlite_databases`, `ai_models`, `dependencies`,
//! `profile`, `self` outbound hosts and `[application.trigger.*]` settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context as _};
use serde::Deserialize;

use crate::outbound::AllowedHostsConfig;
use crate::variables::{validate_variable_name, Template};

/// A parsed and validated `spin.toml`.
#[derive(Debug, Clone)]
pub struct AppManifest {
    /// Path of the manifest file as given.
    pub path: PathBuf,
    /// Directory containing the manifest; component sources, build working
    /// directories and the default key-value file are relative to it.
    pub dir: PathBuf,
    /// `[application] name`.
    pub name: String,
    /// `[application] version` (empty when absent).
    pub version: String,
    /// `[application] description` (empty when absent).
    pub description: String,
    /// Application variables, sorted by name.
    pub variables: Vec<(String, VariableDef)>,
    /// `[[trigger.http]]` entries, in manifest order.
    pub http_triggers: Vec<HttpTrigger>,
    /// Components, sorted by id.
    pub components: Vec<ComponentDef>,
}

/// An application variable definition from `[variables]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariableDef {
    /// `default = "..."`, if any.
    pub default: Option<String>,
    /// `required = true`.
    pub required: bool,
    /// `secret = true`: the value is never printed.
    pub secret: bool,
}

/// The route of an HTTP trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerRoute {
    /// A routable pattern such as `/exact`, `/prefix/...` or `/a/:id`.
    Route(String),
    /// `{ private = true }`: the component is not externally routable.
    Private,
}

/// One `[[trigger.http]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTrigger {
    /// Optional `id`.
    pub id: Option<String>,
    /// The route.
    pub route: TriggerRoute,
    /// The component id it maps to.
    pub component: String,
}

/// A `[component.<id>]` definition.
#[derive(Debug, Clone)]
pub struct ComponentDef {
    /// The component id.
    pub id: String,
    /// `source`, resolved against the manifest directory.
    pub source: PathBuf,
    /// `source` as written in the manifest.
    pub source_raw: String,
    /// `description` (empty when absent).
    pub description: String,
    /// `[component.<id>.variables]`: name to template, sorted by name.
    pub variables: Vec<(String, Template)>,
    /// `environment`: WASI environment variables for the component.
    pub environment: Vec<(String, String)>,
    /// `allowed_outbound_hosts` as written (templates unresolved).
    pub allowed_outbound_hosts: Vec<String>,
    /// `key_value_stores` labels.
    pub key_value_stores: Vec<String>,
    /// `[component.<id>.build]`, if any.
    pub build: Option<BuildConfig>,
}

/// `[component.<id>.build]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildConfig {
    /// The command(s), run in order with `sh -c`.
    pub commands: Vec<String>,
    /// Working directory relative to the manifest directory (`None` = the
    /// manifest directory itself).
    pub workdir: Option<String>,
}

// ---------------------------------------------------------------------------
// Raw serde model (strict: unknown keys are errors).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    spin_manifest_version: toml::Value,
    application: RawApplication,
    #[serde(default)]
    variables: BTreeMap<String, toml::Value>,
    #[serde(default)]
    trigger: BTreeMap<String, Vec<toml::Table>>,
    #[serde(default)]
    component: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApplication {
    name: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    #[allow(dead_code)]
    authors: Vec<String>,
    #[serde(default)]
    #[allow(dead_code)]
    targets: Vec<toml::Value>,
    #[serde(default)]
    trigger: toml::Table,
    #[serde(default)]
    #[allow(dead_code)]
    tool: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariable {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    required: bool,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    secret: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComponent {
    source: toml::Value,
    #[serde(default)]
    description: String,
    #[serde(default)]
    variables: toml::Table,
    #[serde(default)]
    environment: toml::Table,
    #[serde(default)]
    files: Vec<toml::Value>,
    #[serde(default)]
    exclude_files: Vec<String>,
    #[serde(default)]
    allowed_http_hosts: Vec<String>,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    key_value_stores: Vec<String>,
    #[serde(default)]
    sqlite_databases: Vec<String>,
    #[serde(default)]
    ai_models: Vec<String>,
    #[serde(default)]
    build: Option<RawBuild>,
    #[serde(default)]
    #[allow(dead_code)]
    tool: toml::Table,
    #[serde(default)]
    dependencies_inherit_configuration: bool,
    #[serde(default)]
    dependencies: toml::Table,
    #[serde(default)]
    profile: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuild {
    command: RawCommands,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    watch: Vec<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawCommands {
    Single(String),
    Multiple(Vec<String>),
}

// ---------------------------------------------------------------------------

impl AppManifest {
    /// Reads and validates the manifest at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read manifest {}", path.display()))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Self::parse(&text, path, &dir)
            .with_context(|| format!("invalid manifest {}", path.display()))
    }

    /// Parses and validates manifest text. `path` is recorded as given;
    /// relative paths in the manifest are resolved against `dir`.
    pub fn parse(text: &str, path: &Path, dir: &Path) -> anyhow::Result<Self> {
        let raw: RawManifest = toml::from_str(text)
            .context("manifest is not valid TOML for spin_manifest_version 2")?;

        match &raw.spin_manifest_version {
            toml::Value::Integer(2) => {}
            other => bail!(
                "unsupported spin_manifest_version {other}: only manifest version 2 (an integer) is supported"
            ),
        }
        ensure!(
            !raw.application.name.is_empty(),
            "[application] name must not be empty"
        );
        if let Some(key) = raw.application.trigger.keys().next() {
            bail!("[application.trigger.{key}] is not supported by this host");
        }

        // Variables.
        let mut variables = Vec::new();
        for (name, value) in raw.variables {
            validate_variable_name(&name)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("invalid [variables] name {name:?}"))?;
            let var: RawVariable = value
                .try_into()
                .with_context(|| format!("invalid definition of variable {name:?}"))?;
            if var.required && var.default.is_some() {
                bail!("variable {name:?} cannot be both required and have a default");
            }
            if !var.required && var.default.is_none() {
                bail!("variable {name:?} must either be required or have a default");
            }
            variables.push((
                name,
                VariableDef {
                    default: var.default,
                    required: var.required,
                    secret: var.secret,
                },
            ));
        }
        let is_app_var = |n: &str| variables.iter().any(|(v, _)| v == n);

        // Components.
        let mut components = Vec::new();
        for (id, value) in raw.component {
            validate_kebab_id(&id).with_context(|| format!("invalid component id {id:?}"))?;
            let toml::Value::Table(table) = value else {
                bail!("[component.{id}] must be a table");
            };
            let comp: RawComponent = toml::Value::Table(table)
                .try_into()
                .with_context(|| format!("invalid [component.{id}]"))?;
            components.push(
                convert_component(&id, comp, dir, &is_app_var)
                    .with_context(|| format!("invalid [component.{id}]"))?,
            );
        }

        // Triggers.
        let mut http_triggers = Vec::new();
        for (kind, entries) in raw.trigger {
            if kind != "http" {
                bail!(
                    "trigger type {kind:?} is not supported by this host (only [[trigger.http]])"
                );
            }
            for (index, entry) in entries.into_iter().enumerate() {
                let trigger = convert_http_trigger(entry)
                    .with_context(|| format!("invalid [[trigger.http]] entry #{}", index + 1))?;
                ensure!(
                    components
                        .iter()
                        .any(|c: &ComponentDef| c.id == trigger.component),
                    "[[trigger.http]] entry #{} refers to undefined component {:?}",
                    index + 1,
                    trigger.component
                );
                http_triggers.push(trigger);
            }
        }

        Ok(AppManifest {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            name: raw.application.name,
            version: raw.application.version,
            description: raw.application.description,
            variables,
            http_triggers,
            components,
        })
    }

    /// Looks up a component by id.
    pub fn component(&self, id: &str) -> Option<&ComponentDef> {
        self.components.iter().find(|c| c.id == id)
    }

    /// Looks up an application variable definition by name.
    pub fn variable(&self, name: &str) -> Option<&VariableDef> {
        self.variables
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The components referenced by at least one HTTP trigger, sorted by
    /// id.
    pub fn triggered_components(&self) -> Vec<&ComponentDef> {
        self.components
            .iter()
            .filter(|c| self.http_triggers.iter().any(|t| t.component == c.id))
            .collect()
    }

    /// The distinct build steps of the triggered components, as
    /// `(command, working directory)` pairs in component order. A command
    /// shared by several components appears once.
    pub fn build_steps(&self) -> Vec<(String, PathBuf)> {
        let mut steps: Vec<(String, PathBuf)> = Vec::new();
        for comp in self.triggered_components() {
            let Some(build) = &comp.build else { continue };
            let workdir = match &build.workdir {
                Some(w) => self.dir.join(w),
                None => self.dir.clone(),
            };
            for command in &build.commands {
                let step = (command.clone(), workdir.clone());
                if !steps.contains(&step) {
                    steps.push(step);
                }
            }
        }
        steps
    }
}

fn convert_component(
    id: &str,
    comp: RawComponent,
    dir: &Path,
    is_app_var: &dyn Fn(&str) -> bool,
) -> anyhow::Result<ComponentDef> {
    let source_raw = match comp.source {
        toml::Value::String(s) => s,
        toml::Value::Table(_) => {
            bail!("only local file sources are supported (`source = \"path/to.wasm\"`), not URL or registry sources")
        }
        other => bail!("`source` must be a string path, got {other}"),
    };
    ensure!(!source_raw.is_empty(), "`source` must not be empty");
    let unsupported = [
        ("files", !comp.files.is_empty()),
        ("exclude_files", !comp.exclude_files.is_empty()),
        (
            "allowed_http_hosts (deprecated: use allowed_outbound_hosts)",
            !comp.allowed_http_hosts.is_empty(),
        ),
        ("sqlite_databases", !comp.sqlite_databases.is_empty()),
        ("ai_models", !comp.ai_models.is_empty()),
        ("dependencies", !comp.dependencies.is_empty()),
        (
            "dependencies_inherit_configuration",
            comp.dependencies_inherit_configuration,
        ),
        ("profile", !comp.profile.is_empty()),
    ];
    for (key, present) in unsupported {
        if present {
            bail!("`{key}` is not supported by this host");
        }
    }

    let mut variables = Vec::new();
    for (name, value) in comp.variables {
        validate_variable_name(&name)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("invalid component variable name {name:?}"))?;
        let toml::Value::String(text) = value else {
            bail!("component variable {name:?} must be a string");
        };
        let template = Template::parse(&text)
            .with_context(|| format!("invalid template for component variable {name:?}"))?;
        for var in template.referenced_variables() {
            ensure!(
                is_app_var(var),
                "component variable {name:?} refers to unknown application variable {var:?}"
            );
        }
        variables.push((name, template));
    }

    let mut environment = Vec::new();
    for (name, value) in comp.environment {
        let toml::Value::String(text) = value else {
            bail!("environment variable {name:?} must be a string");
        };
        environment.push((name, text));
    }

    for label in &comp.key_value_stores {
        ensure!(
            validate_kebab_id(label).is_ok() || validate_snake_id(label).is_ok(),
            "key_value_stores label {label:?} must be kebab-case or snake_case"
        );
    }

    AllowedHostsConfig::validate(&comp.allowed_outbound_hosts)?;
    for host in &comp.allowed_outbound_hosts {
        let template = Template::parse(host)?;
        for var in template.referenced_variables() {
            ensure!(
                is_app_var(var),
                "allowed_outbound_hosts entry {host:?} refers to unknown application variable {var:?}"
            );
        }
    }

    let build = comp.build.map(|b| BuildConfig {
        commands: match b.command {
            RawCommands::Single(c) => vec![c],
            RawCommands::Multiple(cs) => cs,
        },
        workdir: b.workdir,
    });

    Ok(ComponentDef {
        id: id.to_string(),
        source: dir.join(&source_raw),
        source_raw,
        description: comp.description,
        variables,
        environment,
        allowed_outbound_hosts: comp.allowed_outbound_hosts,
        key_value_stores: comp.key_value_stores,
        build,
    })
}

fn convert_http_trigger(mut entry: toml::Table) -> anyhow::Result<HttpTrigger> {
    let id = match entry.remove("id") {
        None => None,
        Some(toml::Value::String(s)) => Some(s),
        Some(other) => bail!("`id` must be a string, got {other}"),
    };
    let route = match entry.remove("route") {
        None => bail!("`route` is required"),
        Some(toml::Value::String(s)) => TriggerRoute::Route(s),
        Some(toml::Value::Table(mut t)) => {
            let private = t.remove("private");
            if let Some(key) = t.keys().next() {
                bail!("unknown key {key:?} in `route` table (only `private` is allowed)");
            }
            match private {
                Some(toml::Value::Boolean(true)) => TriggerRoute::Private,
                _ => bail!("route must be a string pattern or '{{ private = true }}'"),
            }
        }
        Some(other) => bail!("`route` must be a string or `{{ private = true }}`, got {other}"),
    };
    let component = match entry.remove("component") {
        None => bail!("`component` is required (static_response triggers are not supported)"),
        Some(toml::Value::String(s)) => s,
        Some(toml::Value::Table(_)) => {
            bail!("inline component definitions are not supported; use `component = \"<id>\"`")
        }
        Some(other) => bail!("`component` must be a component id string, got {other}"),
    };
    if let Some(executor) = entry.remove("executor") {
        let ok = matches!(&executor, toml::Value::Table(t)
            if t.len() == 1 && t.get("type").and_then(|v| v.as_str()) == Some("http"));
        ensure!(
            ok,
            "only `executor = {{ type = \"http\" }}` is supported (got {executor})"
        );
    }
    if let Some(key) = entry.keys().next() {
        bail!("`{key}` is not supported in [[trigger.http]] by this host");
    }
    Ok(HttpTrigger {
        id,
        route,
        component,
    })
}

/// Validates a Spin "kebab-case" id (component ids, store labels).
fn validate_kebab_id(id: &str) -> anyhow::Result<()> {
    validate_id(id, '-', false)
}

/// Validates a Spin "snake_case" id.
fn validate_snake_id(id: &str) -> anyhow::Result<()> {
    validate_id(id, '_', false)
}

/// The id rules of Spin's `spin_serde::id::Id<DELIM, LOWER>`.
fn validate_id(id: &str, delim: char, lower: bool) -> anyhow::Result<()> {
    ensure!(!id.is_empty(), "empty");
    let wrong = if delim == '_' { '-' } else { '_' };
    ensure!(
        !id.contains(wrong),
        "words must be separated with {delim:?}, not {wrong:?}"
    );
    for (i, word) in id.split(delim).enumerate() {
        let mut chars = word.chars();
        let Some(first) = chars.next() else {
            bail!("{delim:?}-separated words must not be empty");
        };
        ensure!(
            first.is_ascii_alphabetic() || (i > 0 && first.is_ascii_digit()),
            "{delim:?}-separated words must start with an ASCII letter or digit; got {first:?}"
        );
        let upper = first.is_ascii_uppercase();
        for ch in chars {
            if ch.is_ascii_digit() || ch == ':' {
                continue;
            }
            ensure!(
                ch.is_ascii_alphanumeric(),
                "{delim:?}-separated words may only contain alphanumeric ASCII; got {ch:?}"
            );
            ensure!(
                ch.is_ascii_uppercase() == upper,
                "{delim:?}-separated words must be all lowercase or all UPPERCASE; got {word:?}"
            );
        }
        ensure!(
            !(lower && upper),
            "identifier must be all lowercase; got {id:?}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<AppManifest> {
        AppManifest::parse(text, Path::new("/app/spin.toml"), Path::new("/app"))
    }

    const GOOD: &str = r#"
spin_manifest_version = 2
[application]
name = "demo"
version = "1.0.0"
[application.tool.lint]
level = "x"
[variables]
token = { required = true, secret = true }
mode = { default = "auto" }
host = { default = "api.example.com" }
[[trigger.http]]
route = "/a/..."
component = "a"
[[trigger.http]]
route = { private = true }
component = "b"
[component.a]
source = "target/a.wasm"
key_value_stores = ["default", "leases"]
allowed_outbound_hosts = ["https://{{ host }}", "http://127.0.0.1:*"]
environment = { RUST_LOG = "info" }
[component.a.variables]
token = "Bearer {{ token }}"
mode = "{{mode}}"
[component.a.build]
command = "cargo build-wasm"
watch = ["src/**/*.rs"]
[component.b]
source = "/abs/b.wasm"
[component.b.build]
command = ["make a", "cargo build-wasm"]
workdir = "sub"
"#;

    #[test]
    fn parses_good_manifest() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.name, "demo");
        assert_eq!(m.version, "1.0.0");
        assert_eq!(m.variables.len(), 3);
        assert_eq!(
            m.variable("token"),
            Some(&VariableDef {
                default: None,
                required: true,
                secret: true
            })
        );
        assert_eq!(m.http_triggers.len(), 2);
        assert_eq!(
            m.http_triggers[0].route,
            TriggerRoute::Route("/a/...".into())
        );
        assert_eq!(m.http_triggers[1].route, TriggerRoute::Private);
        let a = m.component("a").unwrap();
        assert_eq!(a.source, PathBuf::from("/app/target/a.wasm"));
        assert_eq!(a.key_value_stores, vec!["default", "leases"]);
        assert_eq!(a.variables.len(), 2);
        assert_eq!(
            a.environment,
            vec![("RUST_LOG".to_string(), "info".to_string())]
        );
        assert_eq!(
            m.component("b").unwrap().source,
            PathBuf::from("/abs/b.wasm")
        );
        assert_eq!(
            m.build_steps(),
            vec![
                ("cargo build-wasm".to_string(), PathBuf::from("/app")),
                ("make a".to_string(), PathBuf::from("/app/sub")),
                ("cargo build-wasm".to_string(), PathBuf::from("/app/sub")),
            ]
        );
    }

    #[test]
    fn parses_the_project_manifest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spin.toml");
        let m = AppManifest::from_file(&path).unwrap();
        assert_eq!(m.name, "metal-ipam");
        assert!(m.variable("api_token").unwrap().required);
        assert!(m
            .http_triggers
            .iter()
            .any(|t| t.route == TriggerRoute::Route("/healthz".into())));
        // All components share one build command: --build runs it once.
        assert_eq!(m.build_steps().len(), 1);
    }

    fn assert_rejected(text: &str, needle: &str) {
        let err = format!("{:#}", parse(text).unwrap_err());
        assert!(
            err.contains(needle),
            "error {err:?} does not mention {needle:?}"
        );
    }

    const HEAD: &str = "spin_manifest_version = 2\n[application]\nname = \"x\"\n";

    #[test]
    fn rejects_unsupported_manifests() {
        assert_rejected(
            "spin_manifest_version = \"1\"\n[application]\nname = \"x\"",
            "only manifest version 2",
        );
        assert_rejected(&format!("{HEAD}unknown = 1\n"), "unknown");
        assert_rejected(
            &format!("{HEAD}[application.trigger.http]\nbase = \"/\"\n"),
            "application.trigger.http",
        );
        assert_rejected(
            &format!("{HEAD}[[trigger.redis]]\nchannel = \"c\"\ncomponent = \"a\"\n[component.a]\nsource = \"a.wasm\"\n"),
            "trigger type \"redis\"",
        );
        assert_rejected(
            &format!("{HEAD}[[trigger.http]]\nroute = \"/\"\ncomponent = \"missing\"\n"),
            "undefined component",
        );
        assert_rejected(
            &format!(
                "{HEAD}[[trigger.http]]\nroute = \"/\"\ncomponent = {{ source = \"a.wasm\" }}\n"
            ),
            "inline component",
        );
        assert_rejected(
            &format!("{HEAD}[[trigger.http]]\nroute = \"/\"\nstatic_response = {{ status_code = 200 }}\n"),
            "static_response",
        );
        assert_rejected(
            &format!("{HEAD}[[trigger.http]]\nroute = {{ private = false }}\ncomponent = \"a\"\n[component.a]\nsource = \"a.wasm\"\n"),
            "private = true",
        );
        assert_rejected(
            &format!("{HEAD}[[trigger.http]]\nroute = \"/\"\ncomponent = \"a\"\nexecutor = {{ type = \"wagi\" }}\n[component.a]\nsource = \"a.wasm\"\n"),
            "executor",
        );
        assert_rejected(&format!("{HEAD}[component.a]\nsource = {{ url = \"https://x/a.wasm\", digest = \"sha256:00\" }}\n"), "local file sources");
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\nfiles = [\"x\"]\n"),
            "`files`",
        );
        assert_rejected(
            &format!(
                "{HEAD}[component.a]\nsource = \"a.wasm\"\nsqlite_databases = [\"default\"]\n"
            ),
            "sqlite_databases",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\nbogus = 1\n"),
            "bogus",
        );
        assert_rejected(
            &format!("{HEAD}[component.A_b]\nsource = \"a.wasm\"\n"),
            "invalid component id",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\nkey_value_stores = [\"b@d\"]\n"),
            "kebab-case or snake_case",
        );
        assert_rejected(
            &format!("{HEAD}[variables]\nv = {{ required = true, default = \"x\" }}\n"),
            "both required",
        );
        assert_rejected(
            &format!("{HEAD}[variables]\nv = {{ secret = true }}\n"),
            "must either be required",
        );
        assert_rejected(
            &format!("{HEAD}[variables]\nBad = {{ default = \"x\" }}\n"),
            "invalid [variables] name",
        );
        assert_rejected(
            &format!("{HEAD}[variables]\nv = {{ default = \"x\", bogus = 1 }}\n"),
            "bogus",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\n[component.a.variables]\nx = \"{{{{ nope }}}}\"\n"),
            "unknown application variable \"nope\"",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\n[component.a.variables]\nx = \"{{{{ nope\"\n"),
            "unmatched",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\nallowed_outbound_hosts = [\"example.com\"]\n"),
            "does not contain a scheme",
        );
        assert_rejected(
            &format!("{HEAD}[component.a]\nsource = \"a.wasm\"\nallowed_outbound_hosts = [\"http://self\"]\n"),
            "requests to `self`",
        );
    }

    #[test]
    fn id_rules() {
        assert!(validate_kebab_id("fn-healthz").is_ok());
        assert!(validate_kebab_id("a1-2b").is_ok());
        assert!(validate_kebab_id("1a").is_err());
        assert!(validate_kebab_id("a_b").is_err());
        assert!(validate_kebab_id("a--b").is_err());
        assert!(validate_snake_id("snake_case").is_ok());
    }
}
