//! Validation of objects against Kubernetes structural schemas (CRDs) and
//! JSON Schemas, on top of the [`jsonschema`] crate.
//!
//! Tests use it to check objects against CustomResourceDefinitions (ours in
//! `deploy/crds/` and the Cluster API ones vendored in `tests/fixtures/crds/`)
//! and against the JSON Schemas of the key-value records in `kv-schema/`,
//! without a Kubernetes API server. This module owns:
//!
//! * reading CRDs: [`load_crd`] reads a CRD YAML file into a [`Crd`], whose
//!   [`schema_for`](Crd::schema_for) gives a version's [`Schema`];
//! * the Kubernetes-to-JSON-Schema mapping, [`to_json_schema`];
//! * [`validate`]: it checks a value with `jsonschema` and returns every
//!   [`SchemaError`], each with the path of the offending field in the form
//!   the API server uses (`spec.addresses[2]`, `spec.preAllocations[web-cp-0]`);
//! * [`Schema::structural_errors`], a lint for what an API server would
//!   refuse in a structural schema (a missing `type`, `$ref`,
//!   `additionalProperties: false`, …). It is not a validation engine.
//!
//! # Two dialects
//!
//! A schema is read in one of two [`Dialect`]s. [`validate`] picks it with
//! [`Dialect::detect`]: a schema whose root has `$schema`, `$id` or `$defs`
//! (all forbidden in a CRD) is a JSON Schema, anything else is Kubernetes.
//! [`validate_as`] takes it explicitly.
//!
//! * [`Dialect::JsonSchema`] (the `kv-schema/*.json` files): the schema goes
//!   to `jsonschema` as is (draft 2020-12 unless `$schema` names another).
//!   Unknown fields are allowed unless `additionalProperties` says otherwise,
//!   `1.0` is an integer, and every format `jsonschema` knows is asserted
//!   (plus our `cidr`), not just annotated.
//! * [`Dialect::Kubernetes`] (OpenAPI v3 as used in CRDs): the schema is first
//!   rewritten by [`to_json_schema`], then checked as draft 2020-12. A
//!   [`Schema`] compiles its validator once, on first use.
//!
//! Any keyword of draft 2020-12 works in either dialect. A schema that
//! `jsonschema` refuses (it breaks the meta-schema, a pattern does not
//! compile, a `$ref` does not resolve) gives one error whose path is `#`
//! followed by a JSON pointer into the schema (for the Kubernetes dialect,
//! into the rewritten schema, which keeps the original's shape).
//!
//! # From a structural schema to JSON Schema
//!
//! [`to_json_schema`] applies these rules, node by node:
//!
//! * **Unknown fields are errors**, which is what pruning followed by strict
//!   field validation amounts to: an object schema (`type: object`, or no
//!   `type` at all) without `additionalProperties` and without
//!   `x-kubernetes-preserve-unknown-fields: true` gets
//!   `additionalProperties: false` (and `properties: {}` if it had none, so
//!   that `jsonschema` names each unknown field). Not inside `allOf`/`anyOf`/`oneOf`/`not`:
//!   in a CRD those only add value checks and declare no fields.
//! * **Type meta**: at the root and in `x-kubernetes-embedded-resource`
//!   objects, `apiVersion` and `kind` are strings and `metadata` need only be
//!   an object, whether or not the schema lists them; what a listed
//!   `metadata` schema says is checked, but not as closed (ObjectMeta's other
//!   fields are let be).
//! * `nullable: true` adds `"null"` to `type` (and to `enum`, if any).
//! * `x-kubernetes-int-or-string: true` becomes `type: [integer, string]`. (A
//!   type list rather than an `anyOf`: such nodes usually carry their own
//!   `anyOf`, which stays as it is.)
//! * OpenAPI's boolean `exclusiveMinimum`/`exclusiveMaximum` become the
//!   numeric JSON Schema form (`minimum: 0, exclusiveMinimum: true` →
//!   `exclusiveMinimum: 0`).
//! * `format`: `date-time`, `date`, `ipv4`, `ipv6`, `uuid` are checked by
//!   `jsonschema`, `cidr` by a format we register; `int32`/`int64` by our
//!   keyword (below); any other format is an annotation and is dropped.
//! * `x-kubernetes-list-type: set` becomes `uniqueItems: true`; `map` with
//!   `x-kubernetes-list-map-keys` becomes our keyword (below).
//! * `x-kubernetes-validations` (CEL) and every other `x-` extension are
//!   dropped; annotations (`description`, `default`, …) stay and are ignored.
//!
//! # Our checks on top of jsonschema
//!
//! Three custom keywords, registered only for the Kubernetes dialect, cover
//! what JSON Schema cannot say:
//!
//! * `x-metal-ipam-integer-literal` (added wherever `type` has `integer`):
//!   JSON Schema counts `1.0` as an integer, the API server does not.
//! * `x-metal-ipam-int-format` (`int32`/`int64`): JSON Schema formats apply
//!   to strings only, so the range check of an integer format is a keyword.
//! * `x-metal-ipam-list-map-keys`: no two items of a list-type `map` may have
//!   the same key tuple; JSON Schema has no uniqueness by key.
//!
//! And a few touches on the errors, so that they read like the API server's
//! (the fake Kubernetes API turns them into `details.causes`): an instance
//! path (a JSON pointer) becomes a field path, with declared properties
//! joined by `.` and map keys and list indexes in brackets; a missing field
//! (`Required value`) and an unknown one (`unknown field`) are reported at
//! the field itself, duplicates (`Duplicate value: …`) at the later item, and
//! a value of the wrong `type` gets only that error.
//!
//! Deliberate differences from an API server: no defaulting; a `null` is
//! accepted only where `nullable: true` (an API server would prune it, but our
//! code should omit such fields instead of sending `null`); CEL rules are not
//! evaluated; `metadata` itself is not validated beyond being an object.
//!
//! # Examples
//!
//! ```
//! use metal_ipam_tests::schema::{validate, SchemaError};
//! use serde_json::json;
//!
//! let schema = json!({
//!     "type": "object",
//!     "properties": {
//!         "spec": {
//!             "type": "object",
//!             "required": ["prefix"],
//!             "properties": {
//!                 "prefix": {"type": "integer", "minimum": 0, "maximum": 128},
//!                 "addresses": {"type": "array", "items": {"type": "string"}}
//!             }
//!         }
//!     }
//! });
//! assert!(validate(&schema, &json!({"spec": {"prefix": 24}})).is_ok());
//!
//! let errors = validate(&schema, &json!({"spec": {"prefix": 200, "addresses": ["a", 7]}}))
//!     .unwrap_err();
//! let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
//! assert_eq!(paths, ["spec.addresses[1]", "spec.prefix"]);
//! ```

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, ensure, Context, Result};
use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::{Location, LocationSegment};
use jsonschema::{Draft, Keyword, ValidationError, Validator};
use serde::Deserialize;
use serde_json::{json, Map, Value};

// ---------------------------------------------------------------------------
// Errors and dialects
// ---------------------------------------------------------------------------

/// One validation failure: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// The path of the offending value, like `spec.addresses[2]` or
    /// `spec.preAllocations[web-cp-0]`; empty for the root. A path starting
    /// with `#` is a JSON pointer into the schema and marks a problem with the
    /// schema itself (a bad pattern, an unknown type, a dangling `$ref`).
    pub path: String,
    /// The schema keyword that failed: `required`, `maximum`,
    /// `additionalProperties`, `type`, `format`, `x-kubernetes-list-type`, …
    /// (for a problem with the schema itself, the meta-schema's keyword;
    /// `apiVersion` or `kind` when a [`Crd`] does not serve the object's type).
    pub keyword: String,
    /// What is wrong, e.g. `Required value` or
    /// `200 is greater than the maximum of 128`.
    pub message: String,
}

impl SchemaError {
    fn new(path: impl Into<String>, keyword: &str, message: impl Into<String>) -> Self {
        SchemaError {
            path: path.into(),
            keyword: keyword.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "<root>: {}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for SchemaError {}

/// Which set of rules a schema is read with; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Kubernetes structural OpenAPI v3 schemas (CRDs): unknown fields are
    /// errors unless the schema preserves them.
    Kubernetes,
    /// JSON Schema (draft 2020-12): unknown fields are allowed unless
    /// `additionalProperties` forbids them.
    JsonSchema,
}

impl Dialect {
    /// [`Dialect::JsonSchema`] if the schema's root has `$schema`, `$id` or
    /// `$defs` (keywords a CRD may not use), else [`Dialect::Kubernetes`].
    ///
    /// ```
    /// use metal_ipam_tests::schema::Dialect;
    /// use serde_json::json;
    ///
    /// let kv = json!({"$schema": "https://json-schema.org/draft/2020-12/schema"});
    /// assert_eq!(Dialect::detect(&kv), Dialect::JsonSchema);
    /// assert_eq!(Dialect::detect(&json!({"type": "object"})), Dialect::Kubernetes);
    /// ```
    pub fn detect(schema: &Value) -> Dialect {
        let is_json_schema = ["$schema", "$id", "$defs"]
            .iter()
            .any(|k| schema.get(k).is_some());
        if is_json_schema {
            Dialect::JsonSchema
        } else {
            Dialect::Kubernetes
        }
    }
}

/// Validates `value` against `schema`, in the dialect [`Dialect::detect`]
/// picks, and returns every error found (sorted by path), or `Ok(())`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<SchemaError>> {
    validate_as(Dialect::detect(schema), schema, value)
}

/// Validates `value` against `schema` read in the given dialect.
///
/// A schema that does not compile (it breaks the meta-schema, has a pattern
/// that is no regular expression, a `$ref` that does not resolve) gives one
/// error whose path starts with `#`, whatever the value.
pub fn validate_as(
    dialect: Dialect,
    schema: &Value,
    value: &Value,
) -> Result<(), Vec<SchemaError>> {
    check(&compile(dialect, schema)?, value)
}

// ---------------------------------------------------------------------------
// Kubernetes structural schema → JSON Schema
// ---------------------------------------------------------------------------

/// Our keyword for "`integer` means an integer literal".
const INTEGER_LITERAL: &str = "x-metal-ipam-integer-literal";
/// Our keyword for the range of `format: int32`/`int64`.
const INT_FORMAT: &str = "x-metal-ipam-int-format";
/// Our keyword for the key uniqueness of `x-kubernetes-list-type: map`.
const LIST_MAP_KEYS: &str = "x-metal-ipam-list-map-keys";

/// The string formats checked in the Kubernetes dialect (`cidr` is ours, the
/// others `jsonschema`'s).
const STRING_FORMATS: &[&str] = &["date-time", "date", "ipv4", "ipv6", "cidr", "uuid"];

/// Rewrites a Kubernetes structural schema (a CRD's `openAPIV3Schema`) into
/// the draft 2020-12 JSON Schema that accepts the same objects, following the
/// rules in the [module docs](self#from-a-structural-schema-to-json-schema).
///
/// ```
/// use metal_ipam_tests::schema::to_json_schema;
/// use serde_json::json;
///
/// let crd = json!({"type": "object", "properties": {"spec": {"type": "object",
///     "properties": {"port": {"x-kubernetes-int-or-string": true, "nullable": true}}}}});
/// let spec = &to_json_schema(&crd)["properties"]["spec"];
/// assert_eq!(spec["additionalProperties"], false);
/// assert_eq!(spec["properties"]["port"]["type"], json!(["integer", "string", "null"]));
/// ```
pub fn to_json_schema(schema: &Value) -> Value {
    convert(schema, true, true)
}

/// [`to_json_schema`] of one node. `structural` is false inside logical
/// combinators; `root` is true for the root only.
fn convert(node: &Value, structural: bool, root: bool) -> Value {
    let Some(s) = node.as_object() else {
        return node.clone(); // `true`/`false` schemas, or garbage for the meta-schema to report
    };
    let mut out = Map::new();
    for (key, kw) in s {
        let converted = match (key.as_str(), kw) {
            ("properties" | "patternProperties", Value::Object(children)) => Value::Object(
                children
                    .iter()
                    .map(|(name, child)| (name.clone(), convert(child, structural, false)))
                    .collect(),
            ),
            ("items" | "additionalProperties", _) => convert(kw, structural, false),
            ("allOf" | "anyOf" | "oneOf", Value::Array(branches)) => {
                Value::Array(branches.iter().map(|b| convert(b, false, false)).collect())
            }
            ("not", _) => convert(kw, false, false),
            // Rewritten below.
            ("type" | "nullable" | "format", _) => continue,
            ("minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum", _) => continue,
            (k, _) if k.starts_with("x-") => continue,
            _ => kw.clone(),
        };
        out.insert(key.clone(), converted);
    }

    // OpenAPI's boolean exclusive bounds → JSON Schema's numeric ones.
    for (bound, exclusive) in [
        ("minimum", "exclusiveMinimum"),
        ("maximum", "exclusiveMaximum"),
    ] {
        match (s.get(bound), s.get(exclusive)) {
            (Some(limit), Some(Value::Bool(true))) => {
                out.insert(exclusive.into(), limit.clone());
            }
            (limit, flag) => {
                if let Some(limit) = limit {
                    out.insert(bound.into(), limit.clone());
                }
                if let Some(numeric) = flag.filter(|f| !f.is_boolean()) {
                    out.insert(exclusive.into(), numeric.clone());
                }
            }
        }
    }

    match s.get("format") {
        Some(Value::String(f)) if f == "int32" || f == "int64" => {
            out.insert(INT_FORMAT.into(), json!(f));
        }
        Some(Value::String(f)) if STRING_FORMATS.contains(&f.as_str()) => {
            out.insert("format".into(), json!(f));
        }
        Some(Value::String(_)) | None => {} // an annotation
        Some(other) => {
            out.insert("format".into(), other.clone()); // for the meta-schema to refuse
        }
    }

    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let mut types: Vec<Value> = match (int_or_string, s.get("type")) {
        (true, _) => vec![json!("integer"), json!("string")],
        (false, Some(Value::Array(names))) => names.clone(),
        (false, Some(name)) => vec![name.clone()],
        (false, None) => Vec::new(),
    };
    let object_like = types.iter().any(|t| t == "object") || (types.is_empty() && !int_or_string);
    if flag(s, "nullable") {
        if !types.is_empty() {
            types.push(json!("null"));
        }
        if let Some(Value::Array(options)) = out.get_mut("enum") {
            if !options.contains(&Value::Null) {
                options.push(Value::Null);
            }
        }
    }
    if types.iter().any(|t| t == "integer") {
        out.insert(INTEGER_LITERAL.into(), json!(true));
    }
    match types.len() {
        0 => {}
        1 => {
            out.insert("type".into(), types.remove(0));
        }
        _ => {
            out.insert("type".into(), Value::Array(types));
        }
    }

    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            out.insert("uniqueItems".into(), json!(true));
        }
        Some("map") => {
            if let Some(keys) = s.get("x-kubernetes-list-map-keys") {
                out.insert(LIST_MAP_KEYS.into(), keys.clone());
            }
        }
        _ => {}
    }

    if structural && object_like {
        if root || flag(s, "x-kubernetes-embedded-resource") {
            let declared_metadata = s.get("properties").and_then(|p| p.get("metadata"));
            let mut metadata =
                declared_metadata.map_or_else(|| json!({}), |m| convert(m, false, false));
            if let Some(m) = metadata.as_object_mut() {
                m.insert("type".into(), json!("object"));
            }
            if let Some(properties) = out
                .entry("properties")
                .or_insert_with(|| json!({}))
                .as_object_mut()
            {
                for name in ["apiVersion", "kind"] {
                    properties
                        .entry(name)
                        .or_insert_with(|| json!({"type": "string"}));
                }
                properties.insert("metadata".into(), metadata);
            }
        }
        if !s.contains_key("additionalProperties")
            && !flag(s, "x-kubernetes-preserve-unknown-fields")
        {
            // With `properties` beside it (even empty), jsonschema names every
            // unknown field in one error; without, it reports only a false schema.
            out.entry("properties").or_insert_with(|| json!({}));
            out.insert("additionalProperties".into(), json!(false));
        }
    }
    Value::Object(out)
}

// ---------------------------------------------------------------------------
// Our keywords
// ---------------------------------------------------------------------------

type KeywordResult<'a> = Result<Box<dyn for<'i> Keyword<'i>>, ValidationError<'a>>;

/// One of our keywords: a function that lists what is wrong with a value.
struct Check(Box<Problems>);

/// What is wrong with a value, one message each.
type Problems = dyn Fn(&Value) -> Vec<String> + Send + Sync;

impl<'i> Keyword<'i> for Check {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        match (self.0)(instance).into_iter().next() {
            Some(message) => Err(ValidationError::custom(message)),
            None => Ok(()),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        (self.0)(instance).is_empty()
    }

    fn iter_errors(
        &self,
        instance: &'i Value,
    ) -> Box<dyn Iterator<Item = ValidationError<'i>> + 'i> {
        let problems = (self.0)(instance).into_iter();
        Box::new(
            problems.map(|message| -> ValidationError<'i> { ValidationError::custom(message) }),
        )
    }
}

fn check_with(f: impl Fn(&Value) -> Vec<String> + Send + Sync + 'static) -> Box<Check> {
    Box::new(Check(Box::new(f)))
}

/// `x-metal-ipam-integer-literal`: `1` is an integer, `1.0` is not. (A float
/// with a fraction already fails `type: integer`; one without gets past it.)
fn integer_literal<'a>(_: &'a Map<String, Value>, _: &'a Value, _: Location) -> KeywordResult<'a> {
    Ok(check_with(|value| match value {
        Value::Number(n) if n.as_f64().is_some_and(|f| n.is_f64() && f.fract() == 0.0) => {
            vec![format!(
                "{value} is not of type \"integer\" (Kubernetes takes integer literals only)"
            )]
        }
        _ => Vec::new(),
    }))
}

/// `x-metal-ipam-int-format`: the range of `int32` or `int64`.
fn int_format<'a>(_: &'a Map<String, Value>, format: &'a Value, _: Location) -> KeywordResult<'a> {
    let (name, range): (&str, std::ops::RangeInclusive<i128>) = match format.as_str() {
        Some("int32") => ("int32", i32::MIN.into()..=i32::MAX.into()),
        Some("int64") => ("int64", i64::MIN.into()..=i64::MAX.into()),
        _ => {
            return Err(ValidationError::schema(format!(
                "unknown integer format {format}"
            )))
        }
    };
    Ok(check_with(move |value| {
        let n = value
            .as_i64()
            .map(i128::from)
            .or_else(|| value.as_u64().map(i128::from));
        match n {
            Some(n) if !range.contains(&n) => {
                vec![format!("{n} is out of range for format {name}")]
            }
            _ => Vec::new(),
        }
    }))
}

/// `x-metal-ipam-list-map-keys`: no two items of a list with the same key
/// tuple. `jsonschema` reports a keyword's errors at the list's path, so each
/// message starts with the item's index (`[1] Duplicate value: …`), which
/// [`to_schema_errors`] moves into the path.
fn list_map_keys<'a>(_: &'a Map<String, Value>, keys: &'a Value, _: Location) -> KeywordResult<'a> {
    let Some(keys) = keys.as_array().and_then(|k| {
        k.iter()
            .map(|k| k.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
    }) else {
        return Err(ValidationError::schema(
            "x-kubernetes-list-map-keys must be an array of strings",
        ));
    };
    Ok(check_with(move |value| {
        let mut seen = Vec::new();
        let mut duplicates = Vec::new();
        for (i, item) in value.as_array().into_iter().flatten().enumerate() {
            let key: Map<String, Value> = keys
                .iter()
                .map(|k| (k.clone(), item.get(k).cloned().unwrap_or(Value::Null)))
                .collect();
            let key = Value::Object(key);
            if seen.contains(&key) {
                duplicates.push(format!("[{i}] Duplicate value: {key}"));
            }
            seen.push(key);
        }
        duplicates
    }))
}

/// The `cidr` format: an IP address, `/`, a prefix length that fits it.
fn is_cidr(text: &str) -> bool {
    let Some((addr, len)) = text.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    !len.is_empty()
        && len.bytes().all(|c| c.is_ascii_digit())
        && len.parse::<u8>().is_ok_and(|l| l <= max)
}

// ---------------------------------------------------------------------------
// Compiling and checking
// ---------------------------------------------------------------------------

/// Builds the `jsonschema` validator of a schema read in `dialect`.
fn compile(dialect: Dialect, schema: &Value) -> Result<Validator, Vec<SchemaError>> {
    let options = jsonschema::options()
        .should_validate_formats(true)
        .with_format("cidr", is_cidr);
    let built = match dialect {
        Dialect::JsonSchema => options.build(schema),
        Dialect::Kubernetes => options
            .with_draft(Draft::Draft202012)
            .with_keyword(INTEGER_LITERAL, integer_literal)
            .with_keyword(INT_FORMAT, int_format)
            .with_keyword(LIST_MAP_KEYS, list_map_keys)
            .build(&to_json_schema(schema)),
    };
    built.map_err(|e| {
        vec![SchemaError::new(
            format!("#{}", e.instance_path().as_str()),
            e.kind().keyword(),
            format!("invalid schema: {e}"),
        )]
    })
}

/// Every error of `value`, sorted by path; a `type` error hides the others
/// at its path.
fn check(validator: &Validator, value: &Value) -> Result<(), Vec<SchemaError>> {
    let mut errors: Vec<SchemaError> = validator
        .iter_errors(value)
        .flat_map(|e| to_schema_errors(&e))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    let mistyped: Vec<String> = errors
        .iter()
        .filter(|e| e.keyword == "type")
        .map(|e| e.path.clone())
        .collect();
    errors.retain(|e| e.keyword == "type" || !mistyped.contains(&e.path));
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    errors.dedup();
    Err(errors)
}

/// One `jsonschema` error as ours: a field path, and the API server's words
/// where the fake Kubernetes API maps them to a cause (`Required value`,
/// `Unsupported value`, `Duplicate value`, `unknown field`).
fn to_schema_errors(e: &ValidationError<'_>) -> Vec<SchemaError> {
    let path = field_path(e.instance_path(), e.evaluation_path());
    let instance: &Value = e.instance();
    let one = |path: String, keyword: &str, message: String| {
        vec![SchemaError::new(path, keyword, message)]
    };
    match e.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            one(child(&path, &name), "required", "Required value".into())
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|name| {
                SchemaError::new(child(&path, name), "additionalProperties", "unknown field")
            })
            .collect(),
        ValidationErrorKind::Enum { options } => {
            let supported: Vec<String> = match &**options {
                Value::Array(options) => options.iter().map(Value::to_string).collect(),
                other => vec![other.to_string()],
            };
            let message = format!(
                "Unsupported value: {instance}: supported values: {}",
                supported.join(", ")
            );
            one(path, "enum", message)
        }
        ValidationErrorKind::UniqueItems => {
            // Blame each later copy, as the API server does.
            let items = instance.as_array().map_or(&[][..], Vec::as_slice);
            let duplicates: Vec<SchemaError> = (0..items.len())
                .filter(|&i| items[..i].iter().any(|earlier| same(earlier, &items[i])))
                .map(|i| {
                    let message = format!("Duplicate value: {}", items[i]);
                    SchemaError::new(format!("{path}[{i}]"), "uniqueItems", message)
                })
                .collect();
            if duplicates.is_empty() {
                one(path, "uniqueItems", e.to_string())
            } else {
                duplicates
            }
        }
        ValidationErrorKind::Custom { keyword, message } => match keyword.as_str() {
            LIST_MAP_KEYS => {
                let (index, rest) = message
                    .strip_prefix('[')
                    .and_then(|m| m.split_once("] "))
                    .unwrap_or(("?", message));
                one(
                    format!("{path}[{index}]"),
                    "x-kubernetes-list-type",
                    rest.to_owned(),
                )
            }
            INTEGER_LITERAL => one(path, "type", message.clone()),
            INT_FORMAT => one(path, "format", message.clone()),
            other => one(path, other, message.clone()),
        },
        kind => one(path, kind.keyword(), e.to_string()),
    }
}

/// Turns an instance path (a JSON pointer) into a field path, using the
/// evaluation path to tell declared properties (`.name`) from map entries
/// (`[key]`): each `properties/<name>` step of the evaluation path matches
/// one field; each `additionalProperties`, `patternProperties/<regex>`,
/// `items` or `prefixItems/<n>` step matches a key or an index. Other steps
/// (`allOf/0`, `$ref`, …) match nothing in the instance.
fn field_path(instance: &Location, evaluation: &Location) -> String {
    let mut tokens = instance.iter();
    let mut steps = evaluation.iter();
    let mut path = String::new();
    while let Some(step) = steps.next() {
        let LocationSegment::Property(keyword) = step else {
            continue;
        };
        let bracket = match keyword.as_ref() {
            "properties" => {
                steps.next();
                false
            }
            "patternProperties" | "prefixItems" => {
                steps.next();
                true
            }
            "additionalProperties" | "items" | "additionalItems" => true,
            _ => continue,
        };
        let Some(token) = tokens.next() else {
            break;
        };
        push_token(&mut path, &token, bracket);
    }
    for token in tokens {
        push_token(&mut path, &token, false);
    }
    path
}

fn push_token(path: &mut String, token: &LocationSegment<'_>, bracket: bool) {
    match token {
        LocationSegment::Index(i) => {
            let _ = write!(path, "[{i}]");
        }
        LocationSegment::Property(key) if bracket => {
            let _ = write!(path, "[{key}]");
        }
        LocationSegment::Property(name) => *path = child(path, name),
    }
}

/// The path of a declared property: `spec` + `prefix` → `spec.prefix`.
fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Equal as `uniqueItems` sees it, near enough to point at the duplicate: a
/// float equals the number of the same value (`1.0` and `1`).
fn same(a: &Value, b: &Value) -> bool {
    a == b || ((a.is_f64() || b.is_f64()) && a.as_f64().is_some() && a.as_f64() == b.as_f64())
}

fn flag(s: &Map<String, Value>, key: &str) -> bool {
    s.get(key) == Some(&Value::Bool(true))
}

fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

// ---------------------------------------------------------------------------
// Schemas of CRDs
// ---------------------------------------------------------------------------

/// The `openAPIV3Schema` of one CRD version: a [`serde_json::Value`] read in
/// the [`Dialect::Kubernetes`] dialect. Its validator is compiled once, on
/// first use.
///
/// It dereferences to the `Value`, so it can be passed to [`validate`] as
/// well.
pub struct Schema {
    value: Value,
    compiled: OnceLock<Result<Validator, Vec<SchemaError>>>,
}

impl Schema {
    /// Wraps a Kubernetes structural schema.
    pub fn new(schema: Value) -> Schema {
        Schema {
            value: schema,
            compiled: OnceLock::new(),
        }
    }

    /// The schema as JSON.
    pub fn as_value(&self) -> &Value {
        &self.value
    }

    /// Validates an object against this schema with Kubernetes rules (see
    /// [`validate_as`]).
    pub fn validate(&self, object: &Value) -> Result<(), Vec<SchemaError>> {
        let compiled = self
            .compiled
            .get_or_init(|| compile(Dialect::Kubernetes, &self.value));
        match compiled {
            Ok(validator) => check(validator, object),
            Err(problems) => Err(problems.clone()),
        }
    }

    /// The subschema at a dotted field path: `spec.addresses` is
    /// `properties.spec.properties.addresses`; a segment ending in `[]` steps
    /// into `items` (`status.conditions[].type`). `""` is the root.
    ///
    /// ```
    /// use metal_ipam_tests::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::new(json!({"type": "object", "properties": {
    ///     "spec": {"type": "object", "properties": {
    ///         "addresses": {"type": "array", "items": {"type": "string"}}}}}}));
    /// assert_eq!(schema.at("spec.addresses[]").unwrap()["type"], "string");
    /// assert!(schema.at("spec.nope").is_none());
    /// ```
    pub fn at(&self, field_path: &str) -> Option<&Value> {
        let mut node = &self.value;
        if field_path.is_empty() {
            return Some(node);
        }
        for segment in field_path.split('.') {
            let name = segment.trim_end_matches("[]");
            let item_steps = (segment.len() - name.len()) / 2;
            node = node.get("properties")?.get(name)?;
            for _ in 0..item_steps {
                node = node.get("items")?;
            }
        }
        Some(node)
    }

    /// What an API server would refuse (or silently drop) in this schema, as
    /// a structural schema: empty if none. Each error's path is a JSON
    /// pointer into the schema (`#/properties/spec/type`).
    ///
    /// Checked: every node outside `allOf`/`anyOf`/`oneOf`/`not` has a
    /// `type` (unless `x-kubernetes-int-or-string` or
    /// `x-kubernetes-preserve-unknown-fields` stands in for it) that is one
    /// of `object`, `array`, `string`, `integer`, `number`, `boolean`; the
    /// root is an object; arrays have `items`; `properties` and
    /// `additionalProperties` are not both set; the keywords CRDs forbid
    /// (`$ref`, `$schema`, `id`, `definitions`, `dependencies`,
    /// `patternProperties`, `additionalItems`, `uniqueItems: true`,
    /// `additionalProperties: false`, `readOnly: true`) are absent; inside
    /// logical combinators there is no `type`, `description`, `default`,
    /// `nullable`, `additionalProperties` or `x-kubernetes-*`; a
    /// `x-kubernetes-list-type: map` list has object items and list-map keys
    /// that are required scalar properties (or have a default); and
    /// `x-kubernetes-int-or-string` has no `type`. Not checked: that logical
    /// combinators only name fields that the structural part declares, CEL,
    /// and defaults.
    pub fn structural_errors(&self) -> Vec<SchemaError> {
        let mut out = Vec::new();
        if self.value.get("type").and_then(Value::as_str) != Some("object") {
            out.push(SchemaError::new(
                "#",
                "type",
                "the root must have type: object",
            ));
        }
        structural(&self.value, "#", false, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

impl Clone for Schema {
    fn clone(&self) -> Schema {
        Schema::new(self.value.clone())
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Schema) -> bool {
        self.value == other.value
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schema").field(&self.value).finish()
    }
}

impl Deref for Schema {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

/// Keywords an API server refuses anywhere in a CRD schema.
const FORBIDDEN_IN_CRDS: &[&str] = &[
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
];

/// Keywords an API server refuses inside allOf/anyOf/oneOf/not (besides
/// `x-kubernetes-*`).
const FORBIDDEN_IN_LOGICAL: &[&str] = &[
    "type",
    "description",
    "default",
    "nullable",
    "additionalProperties",
];

/// [`Schema::structural_errors`] of one node and its subschemas.
fn structural(node: &Value, ptr: &str, in_logical: bool, out: &mut Vec<SchemaError>) {
    let Some(s) = node.as_object() else {
        return out.push(SchemaError::new(ptr, "type", "a schema must be an object"));
    };
    let at = |key: &str| format!("{ptr}/{}", escape_pointer(key));
    let mut fail = |path: String, keyword: &str, message: String| {
        out.push(SchemaError::new(path, keyword, message))
    };

    for key in s.keys() {
        if FORBIDDEN_IN_CRDS.contains(&key.as_str()) {
            fail(
                at(key),
                key,
                format!("`{key}` is not allowed in a CRD schema"),
            );
        }
        let refused =
            FORBIDDEN_IN_LOGICAL.contains(&key.as_str()) || key.starts_with("x-kubernetes-");
        if in_logical && refused {
            fail(
                at(key),
                key,
                format!("`{key}` is not allowed inside allOf/anyOf/oneOf/not"),
            );
        }
    }
    for (key, refused) in [
        ("uniqueItems", true),
        ("readOnly", true),
        ("additionalProperties", false),
    ] {
        if s.get(key) == Some(&Value::Bool(refused)) {
            fail(at(key), key, format!("{key} cannot be {refused}"));
        }
    }
    if s.contains_key("properties") && s.contains_key("additionalProperties") {
        let message = "properties and additionalProperties are mutually exclusive";
        fail(
            at("additionalProperties"),
            "additionalProperties",
            message.into(),
        );
    }

    let ty = s.get("type").and_then(Value::as_str);
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    if int_or_string && s.contains_key("type") {
        fail(
            at("type"),
            "type",
            "type must be empty with x-kubernetes-int-or-string".into(),
        );
    }
    match ty {
        _ if in_logical => {}
        Some("object" | "array" | "string" | "integer" | "number" | "boolean") => {}
        Some(other) => fail(at("type"), "type", format!("type {other:?} is not allowed")),
        None if int_or_string || flag(s, "x-kubernetes-preserve-unknown-fields") => {}
        None => fail(ptr.to_owned(), "type", "type: Required value".into()),
    }
    if ty == Some("array") && !s.contains_key("items") {
        fail(
            ptr.to_owned(),
            "items",
            "items: Required value for type array".into(),
        );
    }

    if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
        let keys = s
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array);
        match (s.get("items"), keys) {
            (Some(items), Some(keys)) if !keys.is_empty() => {
                if items.get("type").and_then(Value::as_str) != Some("object") {
                    fail(
                        at("items"),
                        "items",
                        "items of a list-type map must be objects".into(),
                    );
                }
                let required = items.get("required").and_then(Value::as_array);
                for key in keys.iter().filter_map(Value::as_str) {
                    let prop = items.get("properties").and_then(|p| p.get(key));
                    let scalar = prop
                        .and_then(|p| p.get("type"))
                        .and_then(Value::as_str)
                        .is_some_and(|t| matches!(t, "string" | "integer" | "number" | "boolean"));
                    let is_required = required.is_some_and(|r| r.contains(&json!(key)));
                    let problem = if !scalar {
                        "must be a scalar property of the items"
                    } else if !is_required && prop.is_some_and(|p| p.get("default").is_none()) {
                        "must be required or have a default"
                    } else {
                        continue;
                    };
                    let keyword = "x-kubernetes-list-map-keys";
                    fail(
                        at(keyword),
                        keyword,
                        format!("list-map key {key:?} {problem}"),
                    );
                }
            }
            _ => fail(
                ptr.to_owned(),
                "x-kubernetes-list-type",
                "x-kubernetes-list-type: map needs items and non-empty x-kubernetes-list-map-keys"
                    .into(),
            ),
        }
    }

    for (key, sub) in s {
        let here = at(key);
        match (key.as_str(), sub) {
            ("properties", Value::Object(children)) => {
                for (name, child) in children {
                    structural(
                        child,
                        &format!("{here}/{}", escape_pointer(name)),
                        in_logical,
                        out,
                    );
                }
            }
            ("items" | "additionalProperties", Value::Object(_)) => {
                structural(sub, &here, in_logical, out)
            }
            ("not", _) => structural(sub, &here, true, out),
            ("allOf" | "anyOf" | "oneOf", Value::Array(branches)) => {
                for (i, branch) in branches.iter().enumerate() {
                    structural(branch, &format!("{here}/{i}"), true, out);
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// CustomResourceDefinitions
// ---------------------------------------------------------------------------

/// Whether a CRD's objects live in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `scope: Namespaced`.
    Namespaced,
    /// `scope: Cluster`.
    Cluster,
}

/// One `additionalPrinterColumns` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrinterColumn {
    /// Column header, e.g. `Free`.
    pub name: String,
    /// Column type: `string`, `integer`, `date`, ….
    #[serde(rename = "type")]
    pub type_: String,
    /// JSONPath of the value, e.g. `.status.ipAddresses.free`.
    pub json_path: String,
    /// Column description, if any.
    #[serde(default)]
    pub description: Option<String>,
    /// 0 for columns shown by default, higher for `-o wide`.
    #[serde(default)]
    pub priority: i32,
}

/// One entry of a CRD's `spec.versions`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrdVersion {
    /// Version name, e.g. `v1alpha1`.
    pub name: String,
    /// Whether the API server serves it.
    pub served: bool,
    /// Whether objects are stored in it (exactly one version is).
    pub storage: bool,
    /// Whether it is marked `deprecated: true`.
    pub deprecated: bool,
    /// Whether it has the `status` subresource.
    pub status_subresource: bool,
    /// Its `additionalPrinterColumns`.
    pub printer_columns: Vec<PrinterColumn>,
    /// Its `schema.openAPIV3Schema`.
    pub schema: Schema,
}

/// A parsed `apiextensions.k8s.io/v1` CustomResourceDefinition.
#[derive(Debug, Clone, PartialEq)]
pub struct Crd {
    name: String,
    labels: BTreeMap<String, String>,
    group: String,
    kind: String,
    list_kind: Option<String>,
    plural: String,
    singular: Option<String>,
    categories: Vec<String>,
    scope: Scope,
    versions: Vec<CrdVersion>,
    raw: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCrd {
    api_version: String,
    kind: String,
    metadata: RawMetadata,
    spec: RawSpec,
}

#[derive(Deserialize)]
struct RawMetadata {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawSpec {
    group: String,
    names: RawNames,
    scope: String,
    versions: Vec<RawVersion>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNames {
    kind: String,
    plural: String,
    #[serde(default)]
    singular: Option<String>,
    #[serde(default)]
    list_kind: Option<String>,
    #[serde(default)]
    categories: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawVersion {
    name: String,
    served: bool,
    storage: bool,
    #[serde(default)]
    deprecated: bool,
    #[serde(default)]
    subresources: Option<RawSubresources>,
    #[serde(default)]
    additional_printer_columns: Vec<PrinterColumn>,
    schema: Option<RawValidation>,
}

#[derive(Deserialize)]
struct RawSubresources {
    #[serde(default)]
    status: Option<Value>,
}

#[derive(Deserialize)]
struct RawValidation {
    #[serde(rename = "openAPIV3Schema")]
    open_api_v3_schema: Value,
}

/// Reads a CRD from a YAML file. The file may hold several YAML documents;
/// exactly one must be a `CustomResourceDefinition`.
///
/// Fails if the file cannot be read or parsed, or the CRD lacks what
/// `apiextensions.k8s.io/v1` requires (group, names, scope, a schema for
/// every version, exactly one storage version).
pub fn load_crd(path: impl AsRef<Path>) -> Result<Crd> {
    let path = path.as_ref();
    let docs = load_yaml_documents(path)?;
    let mut crds: Vec<Value> = docs
        .into_iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition"))
        .collect();
    ensure!(
        crds.len() == 1,
        "{}: expected exactly one CustomResourceDefinition, found {}",
        path.display(),
        crds.len()
    );
    Crd::from_value(crds.remove(0)).with_context(|| path.display().to_string())
}

impl Crd {
    /// Builds a CRD from its JSON form; see [`load_crd`] for what is checked.
    pub fn from_value(doc: Value) -> Result<Crd> {
        let raw: RawCrd =
            serde_json::from_value(doc.clone()).context("not a CustomResourceDefinition")?;
        ensure!(
            raw.api_version == "apiextensions.k8s.io/v1",
            "apiVersion is {:?}, expected apiextensions.k8s.io/v1",
            raw.api_version
        );
        ensure!(
            raw.kind == "CustomResourceDefinition",
            "kind is {:?}",
            raw.kind
        );
        let scope = match raw.spec.scope.as_str() {
            "Namespaced" => Scope::Namespaced,
            "Cluster" => Scope::Cluster,
            other => bail!("scope is {other:?}, expected Namespaced or Cluster"),
        };
        ensure!(!raw.spec.versions.is_empty(), "spec.versions is empty");
        let storage = raw.spec.versions.iter().filter(|v| v.storage).count();
        ensure!(
            storage == 1,
            "expected exactly one storage version, found {storage}"
        );
        let mut versions = Vec::new();
        for v in raw.spec.versions {
            let Some(schema) = v.schema else {
                bail!("version {} has no schema.openAPIV3Schema", v.name);
            };
            versions.push(CrdVersion {
                status_subresource: v.subresources.is_some_and(|s| s.status.is_some()),
                name: v.name,
                served: v.served,
                storage: v.storage,
                deprecated: v.deprecated,
                printer_columns: v.additional_printer_columns,
                schema: Schema::new(schema.open_api_v3_schema),
            });
        }
        Ok(Crd {
            name: raw.metadata.name,
            labels: raw.metadata.labels,
            group: raw.spec.group,
            kind: raw.spec.names.kind,
            list_kind: raw.spec.names.list_kind,
            plural: raw.spec.names.plural,
            singular: raw.spec.names.singular,
            categories: raw.spec.names.categories,
            scope,
            versions,
            raw: doc,
        })
    }

    /// `metadata.name`, which should be `<plural>.<group>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.labels` of the CRD itself.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The API group, e.g. `ipam.metal-ipam.dev`.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The kind, e.g. `MetalIPPool`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The list kind, e.g. `MetalIPPoolList`, if set.
    pub fn list_kind(&self) -> Option<&str> {
        self.list_kind.as_deref()
    }

    /// The plural resource name, e.g. `metalippools`.
    pub fn plural(&self) -> &str {
        &self.plural
    }

    /// The singular resource name, if set.
    pub fn singular(&self) -> Option<&str> {
        self.singular.as_deref()
    }

    /// `names.categories`, e.g. `["cluster-api"]`.
    pub fn categories(&self) -> &[String] {
        &self.categories
    }

    /// Namespaced or cluster-scoped.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// All versions, in file order.
    pub fn versions(&self) -> &[CrdVersion] {
        &self.versions
    }

    /// The version of that name.
    pub fn version(&self, name: &str) -> Option<&CrdVersion> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// Names of the served versions, in file order.
    pub fn served_versions(&self) -> Vec<&str> {
        self.versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.as_str())
            .collect()
    }

    /// Name of the storage version.
    pub fn storage_version(&self) -> &str {
        self.versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.as_str())
            .expect("from_value checked there is one storage version")
    }

    /// The schema of a version, if the CRD has that version.
    pub fn schema_for(&self, version: &str) -> Option<&Schema> {
        self.version(version).map(|v| &v.schema)
    }

    /// The CRD as read.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// Validates an object of this kind: `apiVersion` must be
    /// `<group>/<served version>` and `kind` this CRD's kind; then the
    /// object is checked against that version's schema.
    pub fn validate(&self, object: &Value) -> Result<(), Vec<SchemaError>> {
        let mut errors = Vec::new();
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        let version = match api_version.and_then(|a| a.split_once('/')) {
            Some((group, version)) if group == self.group => match self.version(version) {
                Some(v) if v.served => Some(v),
                _ => {
                    errors.push(SchemaError::new(
                        "apiVersion",
                        "apiVersion",
                        format!(
                            "version {version:?} is not served by {}; served: {}",
                            self.name,
                            self.served_versions().join(", ")
                        ),
                    ));
                    None
                }
            },
            _ => {
                errors.push(SchemaError::new(
                    "apiVersion",
                    "apiVersion",
                    format!(
                        "must be {}/<version>, got {}",
                        self.group,
                        api_version.map_or("nothing".to_owned(), |a| format!("{a:?}"))
                    ),
                ));
                None
            }
        };
        let kind = object.get("kind").and_then(Value::as_str);
        if kind != Some(self.kind.as_str()) {
            errors.push(SchemaError::new(
                "kind",
                "kind",
                format!("must be {:?}, got {kind:?}", self.kind),
            ));
        }
        match version {
            Some(v) if errors.is_empty() => v.schema.validate(object),
            _ => Err(errors),
        }
    }
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

/// Reads every non-empty document of a YAML file as JSON.
pub fn load_yaml_documents(path: impl AsRef<Path>) -> Result<Vec<Value>> {
    let path = path.as_ref();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_yaml_documents(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Reads a YAML file that holds exactly one document, as JSON.
pub fn load_yaml(path: impl AsRef<Path>) -> Result<Value> {
    let path = path.as_ref();
    let mut docs = load_yaml_documents(path)?;
    ensure!(
        docs.len() == 1,
        "{}: expected one YAML document, found {}",
        path.display(),
        docs.len()
    );
    Ok(docs.remove(0))
}

/// Parses every non-empty document of a YAML text as JSON.
///
/// ```
/// let docs = metal_ipam_tests::schema::parse_yaml_documents("---\na: 1\n---\nb: [x]\n").unwrap();
/// assert_eq!(docs, [serde_json::json!({"a": 1}), serde_json::json!({"b": ["x"]})]);
/// ```
pub fn parse_yaml_documents(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The root of this repository (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives one level below the repository root")
        .to_path_buf()
}

/// `tests/fixtures/crds/`: the Cluster API CRDs the tests validate against,
/// vendored unchanged (its README names each file's upstream repository,
/// path and commit).
pub fn capi_crds_dir() -> PathBuf {
    repo_root().join("tests/fixtures/crds")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

    fn errors(schema: &Value, value: Value) -> Vec<SchemaError> {
        validate(schema, &value).err().unwrap_or_default()
    }

    /// The error paths, in order.
    fn paths(schema: &Value, value: Value) -> Vec<String> {
        errors(schema, value).into_iter().map(|e| e.path).collect()
    }

    /// The errors as `path keyword`.
    fn kinds(schema: &Value, value: Value) -> Vec<String> {
        let errors = errors(schema, value).into_iter();
        errors
            .map(|e| format!("{} {}", e.path, e.keyword))
            .collect()
    }

    fn pool_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["addresses", "prefix"],
                    "properties": {
                        "addresses": {"type": "array", "minItems": 1,
                                      "items": {"type": "string", "minLength": 1,
                                                "pattern": "^[0-9a-f.:/-]+$"}},
                        "prefix": {"type": "integer", "format": "int32",
                                   "minimum": 0, "maximum": 128},
                        "grace": {"type": "integer", "format": "int32", "minimum": 0},
                        "pre": {"type": "object",
                                "additionalProperties": {"type": "string"}},
                        "free": {"type": "integer", "format": "int64"},
                        "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1}
                    }
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                           "properties": {"n": {"type": "integer"}}}
            }
        })
    }

    #[test]
    fn the_mapping_to_json_schema() {
        let converted = to_json_schema(&pool_schema());
        let spec = &converted["properties"]["spec"];
        // Closed objects, but not where unknown fields are preserved.
        assert_eq!(converted["additionalProperties"], false);
        assert_eq!(spec["additionalProperties"], false);
        assert_eq!(
            converted["properties"]["status"].get("additionalProperties"),
            None
        );
        let pre = &spec["properties"]["pre"];
        assert_eq!(pre["additionalProperties"], json!({"type": "string"}));
        assert_eq!(
            spec["properties"]["prefix"],
            json!({"type": "integer", "minimum": 0, "maximum": 128,
                   INTEGER_LITERAL: true, INT_FORMAT: "int32"})
        );
        let ratio = json!({"type": "number", "exclusiveMaximum": 1});
        assert_eq!(spec["properties"]["ratio"], ratio);

        let k8s = json!({"type": "object", "properties": {
            "port": {"x-kubernetes-int-or-string": true,
                     "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "mode": {"type": "string", "nullable": true, "enum": ["a", "b"],
                     "format": "hostname", "description": "d"},
            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                     "items": {"type": "string"}},
            "conds": {"type": "array", "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["type"],
                      "items": {"type": "object", "properties": {"type": {"type": "string"}}}},
            "rules": {"type": "object", "x-kubernetes-validations": [{"rule": "true"}]}
        }});
        let converted = to_json_schema(&k8s);
        let p = &converted["properties"];
        assert_eq!(
            p["port"],
            json!({"type": ["integer", "string"], INTEGER_LITERAL: true,
                   "anyOf": [{"type": "integer", INTEGER_LITERAL: true}, {"type": "string"}]})
        );
        assert_eq!(
            p["mode"],
            json!({"type": ["string", "null"], "enum": ["a", "b", null], "description": "d"})
        );
        assert_eq!(p["tags"]["uniqueItems"], true);
        assert_eq!(p["conds"][LIST_MAP_KEYS], json!(["type"]));
        assert_eq!(p["conds"]["items"]["additionalProperties"], false);
        let closed = json!({"type": "object", "properties": {}, "additionalProperties": false});
        assert_eq!(p["rules"], closed);
        // The root implies apiVersion, kind and an open metadata.
        assert_eq!(p["apiVersion"], json!({"type": "string"}));
        assert_eq!(p["metadata"], json!({"type": "object"}));
    }

    #[test]
    fn the_dialects_differ_on_unknown_fields_and_1_0() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let value = json!({"n": 1.0, "extra": true});
        assert_eq!(validate_as(Dialect::JsonSchema, &schema, &value), Ok(()));
        let errors = validate_as(Dialect::Kubernetes, &schema, &value).unwrap_err();
        let found: Vec<(&str, &str)> = errors
            .iter()
            .map(|e| (e.path.as_str(), e.keyword.as_str()))
            .collect();
        assert_eq!(found, [("extra", "additionalProperties"), ("n", "type")]);
        assert_eq!(errors[0].message, "unknown field");
    }

    #[test]
    fn accepts_a_valid_object_with_arbitrary_metadata() {
        let obj = json!({
            "apiVersion": "x/v1", "kind": "P",
            "metadata": {"name": "p", "labels": {"a": "b"}, "anything": [1, 2]},
            "spec": {"addresses": ["10.0.0.0/24"], "prefix": 24, "pre": {"a": "10.0.0.5"},
                     "free": 9223372036854775807_i64, "ratio": 0.5},
            "status": {"n": 3, "extra": {"deep": true}}
        });
        assert_eq!(errors(&pool_schema(), obj), vec![]);
    }

    #[test]
    fn reports_every_error_with_its_path() {
        let obj = json!({
            "metadata": "nope",
            "spec": {"addresses": ["10.0.0.1", "zz", 7], "prefix": 200, "grace": -1,
                     "pre": {"web-0": 5}, "bogus": 1, "ratio": 1},
            "status": {"n": "three"},
            "extra": true
        });
        assert_eq!(
            paths(&pool_schema(), obj),
            [
                "extra",
                "metadata",
                "spec.addresses[1]",
                "spec.addresses[2]",
                "spec.bogus",
                "spec.grace",
                "spec.pre[web-0]",
                "spec.prefix",
                "spec.ratio",
                "status.n",
            ]
        );
    }

    #[test]
    fn required_fields_are_reported_at_the_missing_path() {
        let e = errors(&pool_schema(), json!({"spec": {}}));
        let found: Vec<(&str, &str)> = e
            .iter()
            .map(|e| (e.path.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("spec.addresses", "Required value"),
                ("spec.prefix", "Required value")
            ]
        );
    }

    #[test]
    fn errors_name_the_keyword_and_the_bound() {
        let value = json!({"spec": {"addresses": [], "prefix": 129}});
        let e = errors(&pool_schema(), value.clone());
        assert_eq!(
            kinds(&pool_schema(), value),
            ["spec.addresses minItems", "spec.prefix maximum"]
        );
        assert!(e[1].message.contains("128"), "{e:?}");
    }

    #[test]
    fn int_formats_check_their_range() {
        let s = json!({"type": "integer", "format": "int32"});
        assert!(validate(&s, &json!(2147483647)).is_ok());
        assert_eq!(kinds(&s, json!(2147483648_i64)), [" format"]);
        assert_eq!(kinds(&s, json!(-2147483649_i64)), [" format"]);
        let s = json!({"type": "integer", "format": "int64"});
        assert!(validate(&s, &json!(i64::MIN)).is_ok());
        assert_eq!(kinds(&s, json!(u64::MAX)), [" format"]);
    }

    #[test]
    fn kubernetes_integers_are_integer_literals_but_json_schema_allows_1_0() {
        let k8s = json!({"type": "integer"});
        assert_eq!(kinds(&k8s, json!(1.0)), [" type"]);
        assert_eq!(kinds(&k8s, json!(1.5)), [" type"]);
        assert!(validate(&k8s, &json!(1)).is_ok());
        let js = json!({"$schema": DRAFT, "type": "integer"});
        assert!(validate(&js, &json!(1.0)).is_ok());
        assert_eq!(paths(&js, json!(1.5)), [""]);
    }

    #[test]
    fn nullable_allows_null_and_nothing_else_does() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "string", "nullable": true},
            "b": {"type": "string"},
            "c": {"type": "string", "nullable": true, "enum": ["x"]}}});
        assert!(validate(&s, &json!({"a": null, "c": null})).is_ok());
        assert_eq!(paths(&s, json!({"b": null})), ["b"]);
        assert_eq!(paths(&s, json!({"c": "y"})), ["c"]);
    }

    #[test]
    fn enum_and_const() {
        let s = json!({"type": "string", "enum": ["True", "False", "Unknown"]});
        assert!(validate(&s, &json!("Unknown")).is_ok());
        let e = errors(&s, json!("Maybe"));
        assert!(
            e[0].message.starts_with("Unsupported value: \"Maybe\""),
            "{e:?}"
        );
        // A value of the wrong type gets only the type error.
        assert_eq!(kinds(&s, json!(true)), [" type"]);
        let s = json!({"const": 3});
        assert!(validate(&s, &json!(3.0)).is_ok());
        assert_eq!(kinds(&s, json!(4)), [" const"]);
    }

    #[test]
    fn numeric_bounds_old_and_new_style() {
        let openapi = json!({"type": "number", "minimum": 0, "exclusiveMinimum": true});
        assert_eq!(kinds(&openapi, json!(0)), [" exclusiveMinimum"]);
        assert!(validate(&openapi, &json!(0.001)).is_ok());
        let inclusive = json!({"type": "number", "minimum": 0, "exclusiveMinimum": false});
        assert!(validate(&inclusive, &json!(0)).is_ok());
        let draft = json!({"$schema": DRAFT, "exclusiveMinimum": 0, "exclusiveMaximum": 10});
        assert_eq!(paths(&draft, json!(0)), [""]);
        assert_eq!(paths(&draft, json!(10)), [""]);
        assert!(validate(&draft, &json!(5)).is_ok());
    }

    #[test]
    fn map_keys_go_in_brackets_and_fields_after_dots() {
        let s = json!({"type": "object", "properties": {"pre": {"type": "object",
            "additionalProperties": {"type": "object", "properties": {"ip": {"type": "string"}}}}}});
        let value = json!({"pre": {"web/cp~0": {"ip": 1, "x": 2}}});
        assert_eq!(paths(&s, value), ["pre[web/cp~0].ip", "pre[web/cp~0].x"]);
    }

    #[test]
    fn list_map_keys_must_be_unique() {
        let s = json!({"type": "array", "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"],
                       "items": {"type": "object", "required": ["type"],
                                 "properties": {"type": {"type": "string"},
                                                "status": {"type": "string"}}}});
        let ok = json!([{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]);
        assert!(validate(&s, &ok).is_ok());
        let dup =
            json!([{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]);
        let e = errors(&s, dup);
        assert_eq!(
            kinds(&s, json!([{"type": "A"}, {"type": "A"}])),
            ["[1] x-kubernetes-list-type"]
        );
        assert_eq!((e.len(), e[0].path.as_str()), (1, "[1]"));
        assert_eq!(e[0].message, "Duplicate value: {\"type\":\"Ready\"}");
    }

    #[test]
    fn list_sets_and_unique_items() {
        let s = json!({"type": "array", "x-kubernetes-list-type": "set",
                       "items": {"type": "string"}});
        assert_eq!(paths(&s, json!(["a", "b", "a", "b"])), ["[2]", "[3]"]);
        let s = json!({"$defs": {}, "uniqueItems": true});
        assert_eq!(paths(&s, json!([1, 1.0])), ["[1]"]);
    }

    #[test]
    fn int_or_string() {
        let s = json!({"type": "object", "properties": {"port": {
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]}}});
        assert!(validate(&s, &json!({"port": 80})).is_ok());
        assert!(validate(&s, &json!({"port": "http"})).is_ok());
        assert_eq!(kinds(&s, json!({"port": true})), ["port type"]);
        assert_eq!(kinds(&s, json!({"port": 80.0})), ["port type"]);
    }

    #[test]
    fn preserve_unknown_fields_without_type_accepts_anything() {
        let s = json!({"type": "object", "properties": {
            "raw": {"x-kubernetes-preserve-unknown-fields": true}}});
        assert!(validate(&s, &json!({"raw": [1, {"a": null}]})).is_ok());
        assert!(validate(&s, &json!({"raw": {"x": 1}})).is_ok());
    }

    #[test]
    fn embedded_resources_imply_type_meta() {
        let s = json!({"type": "object", "properties": {"template": {
            "type": "object", "x-kubernetes-embedded-resource": true,
            "properties": {"spec": {"type": "object"}}}}});
        let obj = json!({"template": {"apiVersion": "v1", "kind": "X",
                                      "metadata": {"name": "a"}, "spec": {}}});
        assert!(validate(&s, &obj).is_ok());
        assert_eq!(
            paths(&s, json!({"template": {"kind": 3}})),
            ["template.kind"]
        );
        let unknown = json!({"template": {"spec": {"x": 1}}});
        assert_eq!(paths(&s, unknown), ["template.spec.x"]);
    }

    #[test]
    fn a_declared_metadata_schema_is_checked_but_open() {
        let s = json!({"type": "object", "properties": {"metadata": {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 5}}}}});
        assert!(validate(&s, &json!({"metadata": {"name": "a", "labels": {}}})).is_ok());
        assert_eq!(
            paths(&s, json!({"metadata": {"name": "abcdef"}})),
            ["metadata.name"]
        );
        assert_eq!(paths(&s, json!({"metadata": []})), ["metadata"]);
    }

    #[test]
    fn logical_combinators() {
        // Kubernetes: allOf/anyOf branches add checks but declare no fields.
        let s = json!({"type": "object",
                       "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "anyOf": [{"required": ["a"]}, {"required": ["b"]}]});
        assert!(validate(&s, &json!({"a": "x"})).is_ok());
        assert_eq!(kinds(&s, json!({})), [" anyOf"]);
        let s = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
        assert!(validate(&s, &json!(1.5)).is_ok());
        let e = errors(&s, json!(1));
        assert_eq!(e[0].keyword, "oneOf");
        assert!(e[0].message.contains("more than one"), "{e:?}");
        let s = json!({"allOf": [{"minimum": 1}, {"maximum": 3}]});
        assert_eq!(kinds(&s, json!(4)), [" maximum"]);
        let s = json!({"type": "string", "not": {"enum": ["forbidden"]}});
        assert_eq!(kinds(&s, json!("forbidden")), [" not"]);
        assert!(validate(&s, &json!("fine")).is_ok());
    }

    #[test]
    fn json_schema_refs_and_additional_properties() {
        let s = json!({
            "$schema": DRAFT,
            "type": "object",
            "required": ["pool"],
            "properties": {
                "pool": {"$ref": "#/$defs/name"},
                "addrs": {"type": "array", "items": {"$ref": "#/$defs/addr"}},
                "note": {"type": ["string", "null"]}
            },
            "$defs": {
                "name": {"type": "string", "minLength": 1},
                "addr": {"type": "object", "additionalProperties": false,
                         "required": ["ip"],
                         "properties": {"ip": {"type": "string", "format": "ipv4"}}}
            }
        });
        let ok = json!({"pool": "p", "addrs": [{"ip": "192.0.2.1"}], "note": null, "extra": 1});
        assert!(validate(&s, &ok).is_ok());
        let bad = json!({"pool": "", "addrs": [{"ip": "192.0.2.300", "x": 1}, {}]});
        assert_eq!(
            paths(&s, bad),
            ["addrs[0].ip", "addrs[0].x", "addrs[1].ip", "pool"]
        );
    }

    #[test]
    fn recursive_refs_terminate() {
        let s = json!({"$defs": {"node": {"type": "object",
            "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}}}},
            "$ref": "#/$defs/node"});
        assert!(validate(&s, &json!({"next": {"next": {"v": 1}}})).is_ok());
        let deep = json!({"next": {"next": {"v": "x"}}});
        assert_eq!(paths(&s, deep), ["next.next.v"]);
        // A reference to itself constrains nothing (jsonschema detects the cycle).
        let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
        assert_eq!(validate(&cycle, &json!(1)), Ok(()));
    }

    #[test]
    fn schema_problems_are_errors_with_pointer_paths() {
        let bad_type = json!({"type": "object", "properties": {"d": {"type": "strnig"}}});
        assert_eq!(paths(&bad_type, json!({})), ["#/properties/d/type"]);
        let bad_pattern = json!({"properties": {"b": {"type": "string", "pattern": "("}}});
        assert_eq!(paths(&bad_pattern, json!({})), ["#/properties/b/pattern"]);
        let dangling = json!({"$defs": {}, "properties": {"c": {"$ref": "#/$defs/missing"}}});
        let e = errors(&dangling, json!({}));
        assert_eq!((e.len(), e[0].keyword.as_str()), (1, "$ref"));
        assert!(
            e[0].path.starts_with('#') && e[0].message.contains("/$defs/missing"),
            "{e:?}"
        );
        let unknown_draft = json!({"$schema": "https://example.com/my-draft"});
        assert!(errors(&unknown_draft, json!(1))[0].path.starts_with('#'));
        // A CRD schema's problems do not go away with a valid value.
        let schema = Schema::new(bad_type);
        let e = schema.validate(&json!({})).unwrap_err();
        assert_eq!(e[0].path, "#/properties/d/type");
    }

    #[test]
    fn string_formats() {
        for (format, good, bad) in [
            ("date-time", "2026-11-29T18:17:07Z", "2026-11-29 18:17"),
            (
                "date-time",
                "2026-11-29T18:17:07.123+01:00",
                "2026-13-29T18:17:07Z",
            ),
            ("date", "2026-02-28", "2026-2-28"),
            ("ipv4", "192.0.2.1", "192.0.2"),
            ("ipv6", "2001:db8::1", "2001:db8::g"),
            ("cidr", "2001:db8::/64", "192.0.2.0/33"),
            ("cidr", "192.0.2.0/24", "192.0.2.0"),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567"),
        ] {
            let s = json!({"type": "string", "format": format});
            assert!(validate(&s, &json!(good)).is_ok(), "{format} {good}");
            assert_eq!(kinds(&s, json!(bad)), [" format"], "{format} {bad}");
        }
        let s = json!({"type": "string", "format": "hostname"});
        assert!(validate(&s, &json!("not checked!")).is_ok());
    }

    #[test]
    fn schema_at_navigates_properties_and_items() {
        let s = Schema::new(pool_schema());
        assert_eq!(s.at("spec.prefix").unwrap()["maximum"], 128);
        assert_eq!(s.at("spec.addresses[]").unwrap()["minLength"], 1);
        assert!(s.at("spec.missing").is_none());
        assert_eq!(s.at("").unwrap(), &pool_schema());
    }

    #[test]
    fn structural_lint_flags_what_an_api_server_refuses() {
        let bad = Schema::new(json!({
            "type": "object",
            "properties": {
                "untyped": {"description": "no type"},
                "list": {"type": "array"},
                "closed": {"type": "object", "additionalProperties": false},
                "refd": {"$ref": "#/definitions/x"},
                "conds": {"type": "array", "x-kubernetes-list-type": "map",
                          "x-kubernetes-list-map-keys": ["type"],
                          "items": {"type": "object",
                                    "properties": {"type": {"type": "string"}}}},
                "choice": {"type": "string", "anyOf": [{"type": "string"}]},
                "ios": {"type": "string", "x-kubernetes-int-or-string": true}
            }
        }));
        let found: Vec<String> = bad
            .structural_errors()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            found,
            [
                "#/properties/choice/anyOf/0/type",
                "#/properties/closed/additionalProperties",
                "#/properties/conds/x-kubernetes-list-map-keys",
                "#/properties/ios/type",
                "#/properties/list",
                "#/properties/refd",
                "#/properties/refd/$ref",
                "#/properties/untyped",
            ]
        );
        assert_eq!(Schema::new(pool_schema()).structural_errors(), vec![]);
    }

    #[test]
    fn yaml_documents_become_json() {
        let docs = parse_yaml_documents(
            "---\n# comment\nkind: A\nlabels:\n  x: \"\"\n  n: \"1\"\ncount: 3\n---\n---\nkind: B\n",
        )
        .unwrap();
        assert_eq!(
            docs,
            [
                json!({"kind": "A", "labels": {"x": "", "n": "1"}, "count": 3}),
                json!({"kind": "B"})
            ]
        );
        assert!(parse_yaml_documents("a: [1\n").is_err());
    }

    #[test]
    fn crd_from_value_checks_the_basics() {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.com"},
            "spec": {"group": "example.com", "scope": "Cluster",
                     "names": {"kind": "Thing", "plural": "things"},
                     "versions": [
                        {"name": "v1", "served": true, "storage": true,
                         "subresources": {"status": {}},
                         "schema": {"openAPIV3Schema": {"type": "object"}}},
                        {"name": "v0", "served": false, "storage": false,
                         "schema": {"openAPIV3Schema": {"type": "object"}}}]}
        });
        let parsed = Crd::from_value(crd.clone()).unwrap();
        assert_eq!(parsed.scope(), Scope::Cluster);
        assert_eq!(parsed.served_versions(), ["v1"]);
        assert_eq!(parsed.storage_version(), "v1");
        assert!(parsed.version("v1").unwrap().status_subresource);
        assert!(!parsed.version("v0").unwrap().status_subresource);
        assert!(parsed.schema_for("v2").is_none());
        // Objects of an unserved version or another kind are refused.
        let path_of = |obj: Value| parsed.validate(&obj).unwrap_err()[0].path.clone();
        assert_eq!(
            path_of(json!({"apiVersion": "example.com/v0", "kind": "Thing"})),
            "apiVersion"
        );
        assert_eq!(
            path_of(json!({"apiVersion": "example.com/v1", "kind": "Other"})),
            "kind"
        );
        let thing = json!({"apiVersion": "example.com/v1", "kind": "Thing"});
        assert!(parsed.validate(&thing).is_ok());
        // A root without properties is closed too: spec is unknown here.
        let with_spec = json!({"apiVersion": "example.com/v1", "kind": "Thing", "spec": {}});
        assert_eq!(path_of(with_spec), "spec");

        let mut two_storage = crd.clone();
        two_storage["spec"]["versions"][1]["storage"] = json!(true);
        assert!(Crd::from_value(two_storage).is_err());
        let mut bad_scope = crd.clone();
        bad_scope["spec"]["scope"] = json!("Global");
        assert!(Crd::from_value(bad_scope).is_err());
        let mut no_schema = crd;
        no_schema["spec"]["versions"][0]
            .as_object_mut()
            .unwrap()
            .remove("schema");
        assert!(Crd::from_value(no_schema).is_err());
    }
}
