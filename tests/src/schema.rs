//! A small validator for Kubernetes structural schemas and simple JSON Schemas.
//!
//! Tests use it to check objects against CustomResourceDefinitions (ours in
//! `deploy/crds/` and the Cluster API ones vendored in `tests/fixtures/crds/`)
//! and against the JSON Schemas of the key-value records in `kv-schema/`,
//! without a Kubernetes API server.
//!
//! * [`load_crd`] reads a CRD YAML file into a [`Crd`], whose
//!   [`schema_for`](Crd::schema_for) gives a version's [`Schema`].
//! * [`validate`] checks a value against a schema and returns every
//!   [`SchemaError`], each with the path of the offending field
//!   (`spec.addresses[2]`, `spec.preAllocations[web-cp-0]`).
//! * [`Schema::structural_errors`] lints a CRD schema for what an API server
//!   would refuse in a structural schema (a missing `type`, `$ref`,
//!   `additionalProperties: false`, …).
//!
//! # Two dialects
//!
//! The rules differ in one important way, so a schema is read in one of two
//! [`Dialect`]s:
//!
//! * [`Dialect::Kubernetes`] (OpenAPI v3 as used in CRDs): a field that is not
//!   in `properties` is an error unless the object schema has
//!   `additionalProperties` or `x-kubernetes-preserve-unknown-fields: true`.
//!   That is what pruning followed by strict field validation amounts to. At
//!   the root (and in `x-kubernetes-embedded-resource` objects) `apiVersion`
//!   and `kind` must be strings and `metadata` need only be an object.
//!   `integer` accepts only integer literals (`1`, not `1.0`).
//! * [`Dialect::JsonSchema`] (a draft 2020-12 subset): unknown fields are
//!   allowed unless `additionalProperties` says otherwise, `type` may be a list
//!   and may be `"null"`, `$ref` may point into `$defs`, and `1.0` is an
//!   integer.
//!
//! [`validate`] picks the dialect with [`Dialect::detect`]: a schema whose
//! root has `$schema`, `$id` or `$defs` (all forbidden in a CRD) is a JSON
//! Schema, anything else is Kubernetes. [`validate_as`] takes it explicitly.
//!
//! # Supported keywords
//!
//! `type`, `nullable`, `properties`, `required`, `additionalProperties` (bool
//! or schema), `patternProperties`, `propertyNames`, `items`, `enum`, `const`,
//! `pattern`, `minLength`, `maxLength`, `minimum`, `maximum`,
//! `exclusiveMinimum`/`exclusiveMaximum` (OpenAPI booleans or JSON Schema
//! numbers), `multipleOf`, `minItems`, `maxItems`, `uniqueItems`,
//! `minProperties`, `maxProperties`, `format` (`int32`, `int64`, `date-time`,
//! `date`, `ipv4`, `ipv6`, `cidr`, `uuid` are checked; other formats are
//! annotations), `allOf`, `anyOf`, `oneOf`, `not`, `$ref` to a local JSON
//! pointer (`#/$defs/...`), and the extensions
//! `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-int-or-string`,
//! `x-kubernetes-embedded-resource`, `x-kubernetes-list-type`
//! (`set`/`map`/`atomic`) with `x-kubernetes-list-map-keys`. Annotations
//! (`description`, `default`, `title`, `examples`, …), `x-kubernetes-map-type`,
//! `x-kubernetes-validations` (CEL) and other `x-` extensions are ignored.
//!
//! Any other keyword (`if`, `prefixItems`, `unevaluatedProperties`,
//! `dependentRequired`, …) makes validation fail with an "unsupported schema
//! keyword" error, so that a schema is never silently checked only in part.
//! Errors about the schema itself have a path starting with `#` (a JSON
//! pointer into the schema); all other paths point into the value.
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

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Deref;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Number, Value};

// ---------------------------------------------------------------------------
// Errors and dialects
// ---------------------------------------------------------------------------

/// One validation failure: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// The path of the offending value, like `spec.addresses[2]` or
    /// `spec.preAllocations[web-cp-0]`; empty for the root. A path starting
    /// with `#` is a JSON pointer into the schema and marks a problem with the
    /// schema itself (an unsupported keyword, a bad pattern, a dangling `$ref`).
    pub path: String,
    /// What is wrong, e.g. `Required value` or
    /// `must be less than or equal to 128, got 200`.
    pub message: String,
}

impl SchemaError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        SchemaError {
            path: path.into(),
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
    /// JSON Schema (draft 2020-12 subset): unknown fields are allowed unless
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
/// Problems with the schema itself (unsupported keywords, patterns that do
/// not compile, `$ref`s that do not resolve) are reported as errors too,
/// whether or not the value reaches them.
pub fn validate_as(
    dialect: Dialect,
    schema: &Value,
    value: &Value,
) -> Result<(), Vec<SchemaError>> {
    let mut validator = Validator {
        root: schema,
        dialect,
        regexes: HashMap::new(),
    };
    let mut errors = Vec::new();
    validator.lint(schema, "#", &mut errors);
    if errors.is_empty() {
        let ctx = Ctx {
            structural: true,
            depth: 0,
        };
        validator.check(schema, value, "", ctx, &mut errors);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        errors.sort_by(|a, b| a.path.cmp(&b.path));
        errors.dedup();
        Err(errors)
    }
}

// ---------------------------------------------------------------------------
// The validator
// ---------------------------------------------------------------------------

/// Keywords that carry no assertion and are skipped.
const ANNOTATIONS: &[&str] = &[
    "$anchor",
    "$comment",
    "$defs",
    "$id",
    "$schema",
    "contentEncoding",
    "contentMediaType",
    "default",
    "definitions",
    "deprecated",
    "description",
    "example",
    "examples",
    "externalDocs",
    "readOnly",
    "title",
    "writeOnly",
];

/// Keywords the validator checks.
const ASSERTIONS: &[&str] = &[
    "$ref",
    "additionalProperties",
    "allOf",
    "anyOf",
    "const",
    "enum",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "format",
    "items",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
    "multipleOf",
    "not",
    "nullable",
    "oneOf",
    "pattern",
    "patternProperties",
    "properties",
    "propertyNames",
    "required",
    "type",
    "uniqueItems",
];

const TYPES: &[&str] = &[
    "object", "array", "string", "integer", "number", "boolean", "null",
];

/// Deeper than this, a `$ref` cycle is assumed.
const MAX_DEPTH: usize = 256;

#[derive(Clone, Copy)]
struct Ctx {
    /// False inside `allOf`/`anyOf`/`oneOf`/`not`: in a Kubernetes schema
    /// those only add value checks, so fields they do not list are not
    /// unknown.
    structural: bool,
    depth: usize,
}

impl Ctx {
    fn deeper(self) -> Ctx {
        Ctx {
            depth: self.depth + 1,
            ..self
        }
    }

    fn logical(self) -> Ctx {
        Ctx {
            structural: false,
            depth: self.depth + 1,
        }
    }
}

struct Validator<'s> {
    root: &'s Value,
    dialect: Dialect,
    regexes: HashMap<String, Result<Regex, String>>,
}

impl<'s> Validator<'s> {
    // -- schema lint --------------------------------------------------------

    /// Checks the shape of a schema node and its subschemas, compiling every
    /// pattern on the way.
    fn lint(&mut self, node: &'s Value, ptr: &str, out: &mut Vec<SchemaError>) {
        let map = match node {
            Value::Bool(_) => return,
            Value::Object(map) => map,
            other => {
                out.push(SchemaError::new(
                    ptr,
                    format!(
                        "a schema must be an object or a boolean, got {}",
                        type_name(other)
                    ),
                ));
                return;
            }
        };
        for (key, kw) in map {
            let here = format!("{ptr}/{}", escape_pointer(key));
            match key.as_str() {
                "properties" | "patternProperties" | "$defs" | "definitions" => {
                    let Some(children) = kw.as_object() else {
                        out.push(SchemaError::new(here, "must be an object of schemas"));
                        continue;
                    };
                    for (name, child) in children {
                        if key == "patternProperties" {
                            self.compile(name, &here, out);
                        }
                        self.lint(child, &format!("{here}/{}", escape_pointer(name)), out);
                    }
                }
                "additionalProperties" | "not" | "propertyNames" => self.lint(kw, &here, out),
                "items" => {
                    if kw.is_array() {
                        out.push(SchemaError::new(
                            here,
                            "unsupported schema keyword: tuple `items` (an array of schemas)",
                        ));
                    } else {
                        self.lint(kw, &here, out);
                    }
                }
                "allOf" | "anyOf" | "oneOf" => match kw.as_array() {
                    Some(branches) if !branches.is_empty() => {
                        for (i, branch) in branches.iter().enumerate() {
                            self.lint(branch, &format!("{here}/{i}"), out);
                        }
                    }
                    _ => out.push(SchemaError::new(
                        here,
                        "must be a non-empty array of schemas",
                    )),
                },
                "pattern" => match kw.as_str() {
                    Some(pattern) => self.compile(pattern, &here, out),
                    None => out.push(SchemaError::new(here, "must be a string")),
                },
                "required" | "x-kubernetes-list-map-keys" => {
                    let ok = kw
                        .as_array()
                        .is_some_and(|names| names.iter().all(Value::is_string));
                    if !ok {
                        out.push(SchemaError::new(here, "must be an array of strings"));
                    }
                }
                "type" => {
                    let names: Vec<&Value> = match kw {
                        Value::Array(names) => names.iter().collect(),
                        one => vec![one],
                    };
                    for name in names {
                        if !name.as_str().is_some_and(|n| TYPES.contains(&n)) {
                            out.push(SchemaError::new(&here, format!("unknown type {name}")));
                        }
                    }
                }
                "enum" if !kw.is_array() => {
                    out.push(SchemaError::new(here, "must be an array"));
                }
                "$ref" => {
                    if let Err(message) = self.resolve(kw) {
                        out.push(SchemaError::new(here, message));
                    }
                }
                "minimum" | "maximum" | "multipleOf" if !kw.is_number() => {
                    out.push(SchemaError::new(here, "must be a number"));
                }
                "exclusiveMinimum" | "exclusiveMaximum" if !(kw.is_number() || kw.is_boolean()) => {
                    out.push(SchemaError::new(here, "must be a number or a boolean"));
                }
                "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
                | "maxProperties"
                    if !kw.is_u64() =>
                {
                    out.push(SchemaError::new(here, "must be a non-negative integer"));
                }
                k if ASSERTIONS.contains(&k) || ANNOTATIONS.contains(&k) || k.starts_with("x-") => {
                }
                k => out.push(SchemaError::new(
                    here,
                    format!("unsupported schema keyword `{k}`"),
                )),
            }
        }
    }

    fn compile(&mut self, pattern: &str, ptr: &str, out: &mut Vec<SchemaError>) {
        let compiled = self
            .regexes
            .entry(pattern.to_owned())
            .or_insert_with(|| Regex::new(pattern).map_err(|e| e.to_string()));
        if let Err(e) = compiled {
            out.push(SchemaError::new(
                ptr,
                format!("pattern {pattern:?} does not compile: {e}"),
            ));
        }
    }

    fn regex(&self, pattern: &str) -> &Regex {
        match self.regexes.get(pattern) {
            Some(Ok(re)) => re,
            // lint() compiled every pattern and stopped validation on failure.
            _ => unreachable!("pattern {pattern:?} was not compiled by lint()"),
        }
    }

    /// Resolves a local `$ref` (`#`, `#/$defs/name`, any JSON pointer).
    fn resolve(&self, reference: &Value) -> Result<&'s Value, String> {
        let Some(reference) = reference.as_str() else {
            return Err("$ref must be a string".into());
        };
        let Some(pointer) = reference.strip_prefix('#') else {
            return Err(format!(
                "unsupported $ref {reference:?}: only local references (#/...) are supported"
            ));
        };
        self.root
            .pointer(pointer)
            .ok_or_else(|| format!("$ref {reference:?} does not resolve"))
    }

    // -- value checks -------------------------------------------------------

    fn check(
        &mut self,
        schema: &'s Value,
        value: &Value,
        path: &str,
        ctx: Ctx,
        out: &mut Vec<SchemaError>,
    ) {
        if ctx.depth > MAX_DEPTH {
            out.push(SchemaError::new(
                path,
                "schema nesting too deep (a $ref cycle?)",
            ));
            return;
        }
        let s = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => {
                out.push(SchemaError::new(path, "no value is allowed here"));
                return;
            }
            Value::Object(s) => s,
            _ => return, // reported by lint()
        };

        if let Some(reference) = s.get("$ref") {
            if let Ok(target) = self.resolve(reference) {
                self.check(target, value, path, ctx.deeper(), out);
            }
        }

        if value.is_null() && flag(s, "nullable") {
            return;
        }

        if flag(s, "x-kubernetes-int-or-string")
            && !(is_integer_literal(value) || value.is_string())
        {
            out.push(SchemaError::new(
                path,
                format!("must be an integer or a string, got {}", type_name(value)),
            ));
            return;
        }

        if let Some(types) = s.get("type") {
            let allowed: Vec<&str> = match types {
                Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
                one => one.as_str().into_iter().collect(),
            };
            if !allowed.iter().any(|t| self.type_matches(t, value)) {
                out.push(SchemaError::new(
                    path,
                    format!(
                        "must be of type {}, got {}",
                        allowed.join(" or "),
                        type_name(value)
                    ),
                ));
                return;
            }
        }

        if let Some(Value::Array(options)) = s.get("enum") {
            if !options.iter().any(|o| json_eq(o, value)) {
                let supported: Vec<String> = options.iter().map(Value::to_string).collect();
                out.push(SchemaError::new(
                    path,
                    format!(
                        "Unsupported value: {value}: supported values: {}",
                        supported.join(", ")
                    ),
                ));
            }
        }
        if let Some(expected) = s.get("const") {
            if !json_eq(expected, value) {
                out.push(SchemaError::new(
                    path,
                    format!("must be equal to {expected}, got {value}"),
                ));
            }
        }

        match value {
            Value::String(text) => self.check_string(s, text, path, out),
            Value::Number(n) => check_number(s, n, path, out),
            Value::Array(items) => self.check_array(s, items, path, ctx, out),
            Value::Object(map) => self.check_object(s, map, path, ctx, out),
            Value::Bool(_) | Value::Null => {}
        }

        self.check_logical(s, value, path, ctx, out);
    }

    fn type_matches(&self, name: &str, value: &Value) -> bool {
        match name {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "number" => value.is_number(),
            "null" => value.is_null(),
            "integer" => {
                is_integer_literal(value)
                    || (self.dialect == Dialect::JsonSchema
                        && value
                            .as_f64()
                            .is_some_and(|f| f.is_finite() && f.fract() == 0.0))
            }
            _ => false,
        }
    }

    fn check_string(
        &mut self,
        s: &Map<String, Value>,
        text: &str,
        path: &str,
        out: &mut Vec<SchemaError>,
    ) {
        let len = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
            if len < min {
                out.push(SchemaError::new(
                    path,
                    format!("must be at least {min} characters long, got {len}"),
                ));
            }
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                out.push(SchemaError::new(
                    path,
                    format!("must be at most {max} characters long, got {len}"),
                ));
            }
        }
        if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
            if !self.regex(pattern).is_match(text) {
                out.push(SchemaError::new(
                    path,
                    format!("must match the pattern {pattern:?}, got {text:?}"),
                ));
            }
        }
        if let Some(format) = s.get("format").and_then(Value::as_str) {
            if let Some(problem) = check_string_format(format, text) {
                out.push(SchemaError::new(path, problem));
            }
        }
    }

    fn check_array(
        &mut self,
        s: &'s Map<String, Value>,
        items: &[Value],
        path: &str,
        ctx: Ctx,
        out: &mut Vec<SchemaError>,
    ) {
        let len = items.len() as u64;
        if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
            if len < min {
                out.push(SchemaError::new(
                    path,
                    format!("must have at least {min} items, got {len}"),
                ));
            }
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
            if len > max {
                out.push(SchemaError::new(
                    path,
                    format!("must have at most {max} items, got {len}"),
                ));
            }
        }
        if let Some(item_schema) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                self.check(item_schema, item, &index(path, i), ctx.deeper(), out);
            }
        }

        let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
        if flag(s, "uniqueItems") || list_type == Some("set") {
            for (i, item) in items.iter().enumerate() {
                if items[..i].iter().any(|earlier| json_eq(earlier, item)) {
                    out.push(SchemaError::new(
                        index(path, i),
                        format!("Duplicate value: {item}"),
                    ));
                }
            }
        }
        if list_type == Some("map") {
            let keys: Vec<&str> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|keys| keys.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let key_of = |item: &Value| -> Value {
                let mut key = Map::new();
                for k in &keys {
                    key.insert(
                        (*k).to_owned(),
                        item.get(*k).cloned().unwrap_or(Value::Null),
                    );
                }
                Value::Object(key)
            };
            let mut seen: Vec<Value> = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let key = key_of(item);
                if seen.iter().any(|k| json_eq(k, &key)) {
                    out.push(SchemaError::new(
                        index(path, i),
                        format!("Duplicate value: {key}"),
                    ));
                }
                seen.push(key);
            }
        }
    }

    fn check_object(
        &mut self,
        s: &'s Map<String, Value>,
        map: &Map<String, Value>,
        path: &str,
        ctx: Ctx,
        out: &mut Vec<SchemaError>,
    ) {
        if let Some(Value::Array(required)) = s.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(name) {
                    out.push(SchemaError::new(child(path, name), "Required value"));
                }
            }
        }
        let count = map.len() as u64;
        if let Some(min) = s.get("minProperties").and_then(Value::as_u64) {
            if count < min {
                out.push(SchemaError::new(
                    path,
                    format!("must have at least {min} properties, got {count}"),
                ));
            }
        }
        if let Some(max) = s.get("maxProperties").and_then(Value::as_u64) {
            if count > max {
                out.push(SchemaError::new(
                    path,
                    format!("must have at most {max} properties, got {count}"),
                ));
            }
        }

        let kubernetes = self.dialect == Dialect::Kubernetes;
        // The root of a Kubernetes object, or an embedded object: apiVersion,
        // kind and metadata are implied.
        let object_root = kubernetes
            && ctx.structural
            && (path.is_empty() || flag(s, "x-kubernetes-embedded-resource"));
        let properties = s.get("properties").and_then(Value::as_object);
        let pattern_properties = s.get("patternProperties").and_then(Value::as_object);
        let additional = s.get("additionalProperties");
        let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");

        for (name, field) in map {
            if let Some(names_schema) = s.get("propertyNames") {
                let key = Value::String(name.clone());
                self.check(names_schema, &key, &key_path(path, name), ctx.deeper(), out);
            }
            let declared = properties.and_then(|p| p.get(name));
            if object_root && name == "metadata" {
                if !field.is_object() {
                    out.push(SchemaError::new(
                        child(path, name),
                        format!("must be of type object, got {}", type_name(field)),
                    ));
                } else if let Some(meta_schema) = declared {
                    // Validate what the schema says about metadata (CRDs may
                    // restrict name), but let every other ObjectMeta field be.
                    self.check(meta_schema, field, &child(path, name), ctx.logical(), out);
                }
                continue;
            }
            if object_root && declared.is_none() && (name == "apiVersion" || name == "kind") {
                if !field.is_string() {
                    out.push(SchemaError::new(
                        child(path, name),
                        format!("must be of type string, got {}", type_name(field)),
                    ));
                }
                continue;
            }

            let mut matched = false;
            if let Some(field_schema) = declared {
                self.check(field_schema, field, &child(path, name), ctx.deeper(), out);
                matched = true;
            }
            for (pattern, field_schema) in pattern_properties.into_iter().flatten() {
                if self.regex(pattern).is_match(name) {
                    self.check(
                        field_schema,
                        field,
                        &key_path(path, name),
                        ctx.deeper(),
                        out,
                    );
                    matched = true;
                }
            }
            if matched {
                continue;
            }
            match additional {
                Some(Value::Bool(true)) => {}
                Some(Value::Bool(false)) => {
                    out.push(SchemaError::new(child(path, name), "unknown field"));
                }
                Some(field_schema) => {
                    self.check(
                        field_schema,
                        field,
                        &key_path(path, name),
                        ctx.deeper(),
                        out,
                    );
                }
                None => {
                    if kubernetes && ctx.structural && !preserve {
                        out.push(SchemaError::new(child(path, name), "unknown field"));
                    }
                }
            }
        }
    }

    fn check_logical(
        &mut self,
        s: &'s Map<String, Value>,
        value: &Value,
        path: &str,
        ctx: Ctx,
        out: &mut Vec<SchemaError>,
    ) {
        if let Some(Value::Array(branches)) = s.get("allOf") {
            for branch in branches {
                self.check(branch, value, path, ctx.logical(), out);
            }
        }
        if let Some(Value::Array(branches)) = s.get("anyOf") {
            let results = self.branch_errors(branches, value, path, ctx);
            if results.iter().all(|errors| !errors.is_empty()) {
                out.push(SchemaError::new(
                    path,
                    format!(
                        "must match at least one schema in anyOf ({})",
                        summarize(&results)
                    ),
                ));
            }
        }
        if let Some(Value::Array(branches)) = s.get("oneOf") {
            let results = self.branch_errors(branches, value, path, ctx);
            let matching: Vec<usize> = (0..results.len())
                .filter(|&i| results[i].is_empty())
                .collect();
            match matching.len() {
                1 => {}
                0 => out.push(SchemaError::new(
                    path,
                    format!(
                        "must match exactly one schema in oneOf, matched none ({})",
                        summarize(&results)
                    ),
                )),
                _ => out.push(SchemaError::new(
                    path,
                    format!("must match exactly one schema in oneOf, matched {matching:?}"),
                )),
            }
        }
        if let Some(negated) = s.get("not") {
            let mut errors = Vec::new();
            self.check(negated, value, path, ctx.logical(), &mut errors);
            if errors.is_empty() {
                out.push(SchemaError::new(path, "must not match the schema in `not`"));
            }
        }
    }

    fn branch_errors(
        &mut self,
        branches: &'s [Value],
        value: &Value,
        path: &str,
        ctx: Ctx,
    ) -> Vec<Vec<SchemaError>> {
        branches
            .iter()
            .map(|branch| {
                let mut errors = Vec::new();
                self.check(branch, value, path, ctx.logical(), &mut errors);
                errors
            })
            .collect()
    }
}

fn check_number(s: &Map<String, Value>, n: &Number, path: &str, out: &mut Vec<SchemaError>) {
    let mut fail = |message: String| out.push(SchemaError::new(path, message));

    if let Some(Value::Number(min)) = s.get("minimum") {
        let exclusive = s.get("exclusiveMinimum") == Some(&Value::Bool(true));
        match num_cmp(n, min) {
            Ordering::Less => fail(format!("must be greater than or equal to {min}, got {n}")),
            Ordering::Equal if exclusive => fail(format!("must be greater than {min}, got {n}")),
            _ => {}
        }
    }
    if let Some(Value::Number(min)) = s.get("exclusiveMinimum") {
        if num_cmp(n, min) != Ordering::Greater {
            fail(format!("must be greater than {min}, got {n}"));
        }
    }
    if let Some(Value::Number(max)) = s.get("maximum") {
        let exclusive = s.get("exclusiveMaximum") == Some(&Value::Bool(true));
        match num_cmp(n, max) {
            Ordering::Greater => fail(format!("must be less than or equal to {max}, got {n}")),
            Ordering::Equal if exclusive => fail(format!("must be less than {max}, got {n}")),
            _ => {}
        }
    }
    if let Some(Value::Number(max)) = s.get("exclusiveMaximum") {
        if num_cmp(n, max) != Ordering::Less {
            fail(format!("must be less than {max}, got {n}"));
        }
    }
    if let Some(Value::Number(divisor)) = s.get("multipleOf") {
        let is_multiple = match (as_i128(n), as_i128(divisor)) {
            (Some(a), Some(d)) if d != 0 => a % d == 0,
            _ => {
                let (a, d) = (
                    n.as_f64().unwrap_or(f64::NAN),
                    divisor.as_f64().unwrap_or(0.0),
                );
                let q = a / d;
                q.is_finite() && (q - q.round()).abs() < 1e-9
            }
        };
        if !is_multiple {
            fail(format!("must be a multiple of {divisor}, got {n}"));
        }
    }
    if let Some(format) = s.get("format").and_then(Value::as_str) {
        let range = match format {
            "int32" => Some((i128::from(i32::MIN), i128::from(i32::MAX))),
            "int64" => Some((i128::from(i64::MIN), i128::from(i64::MAX))),
            _ => None,
        };
        if let (Some((lo, hi)), Some(v)) = (range, as_i128(n)) {
            if v < lo || v > hi {
                fail(format!("{n} is out of range for format {format}"));
            }
        }
    }
}

/// Checks the string formats we know; `None` when fine or not checked.
fn check_string_format(format: &str, text: &str) -> Option<String> {
    let ok = match format {
        "date-time" => is_date_time(text),
        "date" => text.len() == 10 && is_date(text),
        "ipv4" => text.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(text),
        "uuid" => is_uuid(text),
        _ => return None,
    };
    (!ok).then(|| format!("must be a valid {format}, got {text:?}"))
}

/// RFC 3339 date-time, leniently: date, `T` (or `t`/space), time with
/// optional fraction, and `Z` or a `±hh:mm` offset.
fn is_date_time(text: &str) -> bool {
    if !text.is_ascii() || text.len() < 20 || !is_date(&text[..10]) {
        return false;
    }
    let rest = &text[10..];
    let Some(rest) = rest
        .strip_prefix('T')
        .or_else(|| rest.strip_prefix('t'))
        .or_else(|| rest.strip_prefix(' '))
    else {
        return false;
    };
    let b = rest.as_bytes();
    if b.len() < 9 || b[2] != b':' || b[5] != b':' {
        return false;
    }
    let (hh, mm, ss) = (
        digits(&rest[0..2]),
        digits(&rest[3..5]),
        digits(&rest[6..8]),
    );
    if !matches!((hh, mm, ss), (Some(h), Some(m), Some(s)) if h < 24 && m < 60 && s <= 60) {
        return false;
    }
    let mut zone = &rest[8..];
    if let Some(fraction) = zone.strip_prefix('.') {
        let n = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        zone = &fraction[n..];
    }
    match zone {
        "Z" | "z" => true,
        _ => {
            let z = zone.as_bytes();
            z.len() == 6
                && (z[0] == b'+' || z[0] == b'-')
                && z[3] == b':'
                && digits(&zone[1..3]).is_some_and(|h| h < 24)
                && digits(&zone[4..6]).is_some_and(|m| m < 60)
        }
    }
}

fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    text.is_ascii()
        && b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && digits(&text[0..4]).is_some()
        && digits(&text[5..7]).is_some_and(|m| (1..=12).contains(&m))
        && digits(&text[8..10]).is_some_and(|d| (1..=31).contains(&d))
}

fn digits(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn is_cidr(text: &str) -> bool {
    let Some((addr, len)) = text.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    digits(len).is_some_and(|l| l <= max)
}

fn is_uuid(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

fn flag(s: &Map<String, Value>, key: &str) -> bool {
    s.get(key) == Some(&Value::Bool(true))
}

fn is_integer_literal(value: &Value) -> bool {
    matches!(value, Value::Number(n) if n.is_i64() || n.is_u64())
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn as_i128(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// Numeric comparison that is exact for integers and falls back to `f64`.
fn num_cmp(a: &Number, b: &Number) -> Ordering {
    match (as_i128(a), as_i128(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => {
            let (x, y) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

/// JSON equality in which `1` equals `1.0`.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => num_cmp(x, y) == Ordering::Equal,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn summarize(results: &[Vec<SchemaError>]) -> String {
    results
        .iter()
        .enumerate()
        .map(|(i, errors)| match errors.first() {
            Some(first) if errors.len() > 1 => {
                format!("branch {i}: {first} and {} more", errors.len() - 1)
            }
            Some(first) => format!("branch {i}: {first}"),
            None => format!("branch {i}: ok"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The path of a declared property: `spec` + `prefix` → `spec.prefix`.
fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// The path of a map entry: `spec.preAllocations` + `web-cp-0` →
/// `spec.preAllocations[web-cp-0]`.
fn key_path(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

/// The path of a list item: `spec.addresses` + 2 → `spec.addresses[2]`.
fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

// ---------------------------------------------------------------------------
// Schemas of CRDs
// ---------------------------------------------------------------------------

/// The `openAPIV3Schema` of one CRD version: a [`serde_json::Value`] read in
/// the [`Dialect::Kubernetes`] dialect.
///
/// It dereferences to the `Value`, so it can be passed to [`validate`] as
/// well.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema(Value);

impl Schema {
    /// Wraps a Kubernetes structural schema.
    pub fn new(schema: Value) -> Schema {
        Schema(schema)
    }

    /// The schema as JSON.
    pub fn as_value(&self) -> &Value {
        &self.0
    }

    /// Validates an object against this schema with Kubernetes rules (see
    /// [`validate_as`]).
    pub fn validate(&self, object: &Value) -> Result<(), Vec<SchemaError>> {
        validate_as(Dialect::Kubernetes, &self.0, object)
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
        let mut node = &self.0;
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
    /// a structural schema: empty if none.
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
        if self.0.get("type").and_then(Value::as_str) != Some("object") {
            out.push(SchemaError::new("#", "the root must have type: object"));
        }
        structural(&self.0, "#", false, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

impl Deref for Schema {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0
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

/// Keywords an API server refuses inside allOf/anyOf/oneOf/not.
const FORBIDDEN_IN_LOGICAL: &[&str] = &[
    "type",
    "description",
    "default",
    "nullable",
    "additionalProperties",
];

fn structural(node: &Value, ptr: &str, in_logical: bool, out: &mut Vec<SchemaError>) {
    let Some(s) = node.as_object() else {
        out.push(SchemaError::new(ptr, "a schema must be an object"));
        return;
    };
    let mut fail = |at: String, message: String| out.push(SchemaError::new(at, message));
    let at = |key: &str| format!("{ptr}/{}", escape_pointer(key));

    for key in s.keys() {
        if FORBIDDEN_IN_CRDS.contains(&key.as_str()) {
            fail(at(key), format!("`{key}` is not allowed in a CRD schema"));
        }
        if in_logical
            && (FORBIDDEN_IN_LOGICAL.contains(&key.as_str()) || key.starts_with("x-kubernetes-"))
        {
            fail(
                at(key),
                format!("`{key}` is not allowed inside allOf/anyOf/oneOf/not"),
            );
        }
    }
    if flag(s, "uniqueItems") {
        fail(at("uniqueItems"), "uniqueItems cannot be true".into());
    }
    if flag(s, "readOnly") {
        fail(at("readOnly"), "readOnly cannot be true".into());
    }
    if s.get("additionalProperties") == Some(&Value::Bool(false)) {
        fail(
            at("additionalProperties"),
            "additionalProperties cannot be false".into(),
        );
    }
    if s.contains_key("properties") && s.contains_key("additionalProperties") {
        fail(
            at("additionalProperties"),
            "properties and additionalProperties are mutually exclusive".into(),
        );
    }

    let ty = s.get("type").and_then(Value::as_str);
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    if int_or_string && s.contains_key("type") {
        fail(
            at("type"),
            "type must be empty with x-kubernetes-int-or-string".into(),
        );
    }
    if !in_logical {
        match ty {
            Some("object" | "array" | "string" | "integer" | "number" | "boolean") => {}
            Some(other) => fail(at("type"), format!("type {other:?} is not allowed")),
            None if int_or_string || preserve => {}
            None => fail(ptr.to_owned(), "type: Required value".into()),
        }
    }
    if ty == Some("array") && !s.contains_key("items") {
        fail(
            ptr.to_owned(),
            "items: Required value for type array".into(),
        );
    }

    if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
        let items = s.get("items");
        let keys = s
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array);
        match (items, keys) {
            (Some(items), Some(keys)) if !keys.is_empty() => {
                if items.get("type").and_then(Value::as_str) != Some("object") {
                    fail(
                        at("items"),
                        "items of a list-type map must be objects".into(),
                    );
                }
                let required: Vec<&str> = items
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                for key in keys.iter().filter_map(Value::as_str) {
                    let prop = items.get("properties").and_then(|p| p.get(key));
                    let scalar = prop
                        .and_then(|p| p.get("type"))
                        .and_then(Value::as_str)
                        .is_some_and(|t| matches!(t, "string" | "integer" | "number" | "boolean"));
                    let has_default = prop.is_some_and(|p| p.get("default").is_some());
                    if !scalar {
                        fail(
                            at("x-kubernetes-list-map-keys"),
                            format!("list-map key {key:?} must be a scalar property of the items"),
                        );
                    } else if !required.contains(&key) && !has_default {
                        fail(
                            at("x-kubernetes-list-map-keys"),
                            format!("list-map key {key:?} must be required or have a default"),
                        );
                    }
                }
            }
            _ => fail(
                ptr.to_owned(),
                "x-kubernetes-list-type: map needs items and non-empty x-kubernetes-list-map-keys"
                    .into(),
            ),
        }
    }

    for (key, sub) in s {
        let here = at(key);
        match key.as_str() {
            "properties" => {
                for (name, child) in sub.as_object().into_iter().flatten() {
                    structural(
                        child,
                        &format!("{here}/{}", escape_pointer(name)),
                        in_logical,
                        out,
                    );
                }
            }
            "items" | "additionalProperties" if sub.is_object() => {
                structural(sub, &here, in_logical, out);
            }
            "not" => structural(sub, &here, true, out),
            "allOf" | "anyOf" | "oneOf" => {
                for (i, branch) in sub.as_array().into_iter().flatten().enumerate() {
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
    use serde_json::json;

    fn errs(schema: &Value, value: &Value) -> Vec<(String, String)> {
        match validate(schema, value) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| (e.path, e.message)).collect(),
        }
    }

    fn paths(schema: &Value, value: &Value) -> Vec<String> {
        errs(schema, value).into_iter().map(|(p, _)| p).collect()
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
    fn accepts_a_valid_object_with_arbitrary_metadata() {
        let obj = json!({
            "apiVersion": "x/v1", "kind": "P",
            "metadata": {"name": "p", "labels": {"a": "b"}, "anything": [1, 2]},
            "spec": {"addresses": ["10.0.0.0/24"], "prefix": 24, "pre": {"a": "10.0.0.5"},
                     "free": 9223372036854775807_i64, "ratio": 0.5},
            "status": {"n": 3, "extra": {"deep": true}}
        });
        assert_eq!(errs(&pool_schema(), &obj), vec![]);
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
            paths(&pool_schema(), &obj),
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
        let e = errs(&pool_schema(), &json!({"spec": {}}));
        assert_eq!(
            e,
            [
                ("spec.addresses".to_owned(), "Required value".to_owned()),
                ("spec.prefix".to_owned(), "Required value".to_owned()),
            ]
        );
    }

    #[test]
    fn messages_name_the_bound() {
        let e = errs(
            &pool_schema(),
            &json!({"spec": {"addresses": [], "prefix": 129}}),
        );
        assert_eq!(e[0].1, "must have at least 1 items, got 0");
        assert_eq!(e[1].1, "must be less than or equal to 128, got 129");
    }

    #[test]
    fn int_formats_check_their_range() {
        let s = json!({"type": "integer", "format": "int32"});
        assert!(validate(&s, &json!(2147483647)).is_ok());
        assert_eq!(paths(&s, &json!(2147483648_i64)), [""]);
        assert_eq!(paths(&s, &json!(-2147483649_i64)), [""]);
        let s = json!({"type": "integer", "format": "int64"});
        assert!(validate(&s, &json!(i64::MIN)).is_ok());
        assert_eq!(paths(&s, &json!(u64::MAX)), [""]);
    }

    #[test]
    fn kubernetes_integers_are_integer_literals_but_json_schema_allows_1_0() {
        let k8s = json!({"type": "integer"});
        assert_eq!(paths(&k8s, &json!(1.0)), [""]);
        assert!(validate(&k8s, &json!(1)).is_ok());
        let js =
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"});
        assert!(validate(&js, &json!(1.0)).is_ok());
        assert_eq!(paths(&js, &json!(1.5)), [""]);
    }

    #[test]
    fn nullable_allows_null_and_nothing_else_does() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "string", "nullable": true},
            "b": {"type": "string"}}});
        assert!(validate(&s, &json!({"a": null})).is_ok());
        assert_eq!(paths(&s, &json!({"b": null})), ["b"]);
    }

    #[test]
    fn enum_and_const() {
        let s = json!({"type": "string", "enum": ["True", "False", "Unknown"]});
        assert!(validate(&s, &json!("Unknown")).is_ok());
        let e = errs(&s, &json!("Maybe"));
        assert!(e[0].1.starts_with("Unsupported value: \"Maybe\""), "{e:?}");
        let s = json!({"const": 3});
        assert!(validate(&s, &json!(3.0)).is_ok());
        assert_eq!(paths(&s, &json!(4)), [""]);
    }

    #[test]
    fn string_lengths_count_characters() {
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
        assert!(validate(&s, &json!("äöü")).is_ok());
        assert_eq!(paths(&s, &json!("ä")), [""]);
        assert_eq!(paths(&s, &json!("abcd")), [""]);
    }

    #[test]
    fn patterns_search_unless_anchored() {
        let s = json!({"type": "string", "pattern": "b+"});
        assert!(validate(&s, &json!("abbc")).is_ok());
        let s = json!({"type": "string", "pattern": "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"});
        assert!(validate(&s, &json!("MetalIPPool")).is_ok());
        assert_eq!(paths(&s, &json!("Metal_Pool")), [""]);
        assert_eq!(paths(&s, &json!("-x")), [""]);
    }

    #[test]
    fn numeric_bounds_old_and_new_style() {
        let openapi = json!({"type": "number", "minimum": 0, "exclusiveMinimum": true});
        assert_eq!(paths(&openapi, &json!(0)), [""]);
        assert!(validate(&openapi, &json!(0.001)).is_ok());
        let draft = json!({"$schema": "x", "exclusiveMinimum": 0, "exclusiveMaximum": 10});
        assert_eq!(paths(&draft, &json!(0)), [""]);
        assert_eq!(paths(&draft, &json!(10)), [""]);
        assert!(validate(&draft, &json!(5)).is_ok());
        let m = json!({"type": "number", "multipleOf": 0.5});
        assert!(validate(&m, &json!(2.5)).is_ok());
        assert_eq!(paths(&m, &json!(2.2)), [""]);
        let m = json!({"type": "integer", "multipleOf": 4});
        assert_eq!(paths(&m, &json!(6)), [""]);
    }

    #[test]
    fn object_and_array_counts() {
        let s = json!({"type": "object", "minProperties": 1, "maxProperties": 2,
                       "additionalProperties": {"type": "integer"}});
        assert_eq!(paths(&s, &json!({})), [""]);
        assert_eq!(paths(&s, &json!({"a": 1, "b": 2, "c": 3})), [""]);
        assert_eq!(paths(&s, &json!({"a": "x"})), ["[a]"]);
        let s = json!({"type": "array", "maxItems": 1, "items": {"type": "string"}});
        assert_eq!(paths(&s, &json!(["a", "b"])), [""]);
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
        let e = errs(&s, &dup);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "[1]");
        assert_eq!(e[0].1, "Duplicate value: {\"type\":\"Ready\"}");
    }

    #[test]
    fn list_sets_and_unique_items() {
        let s = json!({"type": "array", "x-kubernetes-list-type": "set",
                       "items": {"type": "string"}});
        assert_eq!(paths(&s, &json!(["a", "b", "a"])), ["[2]"]);
        let s = json!({"$defs": {}, "uniqueItems": true});
        assert_eq!(paths(&s, &json!([1, 1.0])), ["[1]"]);
    }

    #[test]
    fn int_or_string() {
        let s = json!({"type": "object", "properties": {"port": {
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]}}});
        assert!(validate(&s, &json!({"port": 80})).is_ok());
        assert!(validate(&s, &json!({"port": "http"})).is_ok());
        assert_eq!(paths(&s, &json!({"port": true})), ["port"]);
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
            paths(&s, &json!({"template": {"kind": 3}})),
            ["template.kind"]
        );
    }

    #[test]
    fn logical_combinators() {
        // Kubernetes: allOf/anyOf branches add checks but declare no fields.
        let s = json!({"type": "object",
                       "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "anyOf": [{"required": ["a"]}, {"required": ["b"]}]});
        assert!(validate(&s, &json!({"a": "x"})).is_ok());
        let e = errs(&s, &json!({}));
        assert_eq!(e.len(), 1);
        assert!(
            e[0].1
                .starts_with("must match at least one schema in anyOf"),
            "{e:?}"
        );
        let s = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
        assert!(validate(&s, &json!(1.5)).is_ok());
        let e = errs(&s, &json!(1));
        assert!(e[0].1.contains("matched [0, 1]"), "{e:?}");
        let s = json!({"allOf": [{"minimum": 1}, {"maximum": 3}]});
        assert_eq!(paths(&s, &json!(4)), [""]);
        let s = json!({"type": "string", "not": {"enum": ["forbidden"]}});
        assert_eq!(paths(&s, &json!("forbidden")), [""]);
        assert!(validate(&s, &json!("fine")).is_ok());
    }

    #[test]
    fn x_kubernetes_validations_are_ignored() {
        let s = json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "self.a == 'never'", "message": "not evaluated"}],
            "properties": {"a": {"type": "string"}}});
        assert!(validate(&s, &json!({"a": "x"})).is_ok());
    }

    #[test]
    fn json_schema_refs_and_additional_properties() {
        let s = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
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
            paths(&s, &bad),
            ["addrs[0].ip", "addrs[0].x", "addrs[1].ip", "pool"]
        );
    }

    #[test]
    fn recursive_refs_terminate() {
        let s = json!({"$defs": {"node": {"type": "object",
            "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}}}},
            "$ref": "#/$defs/node"});
        assert!(validate(&s, &json!({"next": {"next": {"v": 1}}})).is_ok());
        assert_eq!(
            paths(&s, &json!({"next": {"next": {"v": "x"}}})),
            ["next.next.v"]
        );
        let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
        let e = errs(&cycle, &json!(1));
        assert!(e[0].1.contains("too deep"), "{e:?}");
    }

    #[test]
    fn schema_problems_are_errors_with_pointer_paths() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "string", "if": {"const": 1}},
            "b": {"type": "string", "pattern": "("},
            "c": {"$ref": "#/$defs/missing"},
            "d": {"type": "strnig"}}});
        assert_eq!(
            paths(&s, &json!({})),
            [
                "#/properties/a/if",
                "#/properties/b/pattern",
                "#/properties/c/$ref",
                "#/properties/d/type"
            ]
        );
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
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567"),
        ] {
            let s = json!({"type": "string", "format": format});
            assert!(validate(&s, &json!(good)).is_ok(), "{format} {good}");
            assert_eq!(paths(&s, &json!(bad)), [""], "{format} {bad}");
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
        let obj = json!({"apiVersion": "example.com/v0", "kind": "Thing"});
        assert_eq!(parsed.validate(&obj).unwrap_err()[0].path, "apiVersion");
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Other"});
        assert_eq!(parsed.validate(&obj).unwrap_err()[0].path, "kind");
        assert!(parsed
            .validate(&json!({"apiVersion": "example.com/v1", "kind": "Thing"}))
            .is_ok());

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
