//! A vendored OpenAPI 3.0 document as a simulator uses it: the operation
//! table (method and path template → `operationId`, parameters, request
//! body, responses), request checking (path and query parameters, JSON
//! body) and answer checking, each on validators compiled once, on first
//! use, and shared by every simulator of the process.
//!
//! One loader ([`Spec::load`]) serves every simulator: Metal's bundle
//! ([`spec`]) and phoenixNAP's four specifications
//! (`crate::pnap_sim`). What differs between them is in [`SpecOptions`]:
//! the name used in panics, whether a nested object may come back as
//! `{"href"}` alone (Metal only) and an optional edit of the parsed
//! document before it is compiled (a documented relaxation of a spec
//! inconsistency; Metal needs none).
//!
//! OpenAPI 3.0 schemas are rewritten into JSON Schema draft 2020-12 before
//! they reach `jsonschema` ([`convert`]): `nullable: true` adds `null` to
//! `type` (and to `enum`); `oneOf` becomes `anyOf` (the spec's `oneOf`s are
//! not discriminated and several branches may match, so "at least one" is
//! what can be checked); a `$ref` loses its siblings, as OpenAPI 3.0
//! ignores them; `x-` extensions, `example`, `discriminator` and other
//! annotations are dropped. For requests only, objects are closed: a schema
//! with `properties` or `allOf` and no `additionalProperties` gets
//! `unevaluatedProperties: false`, except schemas used as an `allOf` part
//! (closing a part would refuse its siblings' fields). Answers are checked
//! against the open schemas. For Metal ([`SpecOptions::nested_href`]), a
//! nested referenced object of an answer may also be `{"href": …}` alone:
//! Metal's introduction documents that form for nested objects not named
//! in `include`, although the referenced schemas' `required` lists
//! (`VrfIpReservation` needs `vrf` and `type`) refuse it.
//!
//! Every validator document carries the rewritten `components` next to the
//! schema itself, so `#/components/schemas/…` references resolve within it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use jsonschema::{Draft, Validator};
use percent_encoding::percent_decode_str;
use serde_json::{json, Map, Value};

/// The bundle, compiled into the crate so the simulator binary runs from
/// anywhere.
const BUNDLE: &str = include_str!("../../fixtures/metal-openapi/openapi.bundled.yaml");

/// The base path every operation lives under (the spec's server URL path).
pub const BASE_PATH: &str = "/metal/v1";

const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// How Metal's bundle is read.
const METAL: SpecOptions = SpecOptions {
    name: "Metal",
    nested_href: true,
    relax: None,
};

/// The loaded Metal spec (parsed on first use).
pub(crate) fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| Spec::load(BUNDLE, &METAL))
}

/// What differs between the documents [`Spec::load`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpecOptions {
    /// The API's name, for panics (`"Metal"`, `"phoenixNAP BMC"`).
    pub name: &'static str,
    /// Whether a nested referenced object of an answer may be
    /// `{"href": …}` alone (Metal's `include` convention).
    pub nested_href: bool,
    /// An edit of the parsed document before anything is compiled from
    /// it: where a simulator deliberately departs from its spec, the
    /// departure is made here and listed in that simulator's docs.
    pub relax: Option<fn(&mut Value)>,
}

/// Which way a schema is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Request bodies and parameters: objects are closed.
    Request,
    /// Answers: objects stay open, as the spec writes them.
    Response,
}

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum In {
    Path,
    Query,
    Other,
}

/// The JSON type a parameter's text is read as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Integer,
    Number,
    Boolean,
    Text,
    Object,
    Array(Box<Kind>),
}

#[derive(Debug, Clone)]
struct Param {
    name: String,
    location: In,
    required: bool,
    schema: Value,
    kind: Kind,
    explode: bool,
    deep_object: bool,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    Param(String),
}

/// A request body as declared.
#[derive(Debug, Clone)]
struct Body {
    required: bool,
    schema: Value,
}

/// One operation of the spec.
pub(crate) struct Operation {
    /// `operationId`, e.g. `createVrf` (`"GET /path"` when the spec gives
    /// none).
    pub id: String,
    /// Upper-case method.
    pub method: String,
    /// The path template, e.g. `/projects/{id}/vrfs`.
    pub template: String,
    segments: Vec<Segment>,
    params: Vec<Param>,
    body: Option<Body>,
    /// Status code (`"200"`, `"default"`) → schema of the JSON answer, if
    /// it has one.
    responses: BTreeMap<String, Option<Value>>,
    params_validator: OnceLock<Validator>,
    body_checker: OnceLock<Checker>,
    response_checkers: Mutex<HashMap<String, Arc<Checker>>>,
}

impl std::fmt::Debug for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.method, self.template, self.id)
    }
}

/// What a method and path name in the spec.
pub(crate) enum Lookup<'s> {
    /// An operation, with its path parameters (percent-decoded).
    Found(&'s Operation, BTreeMap<String, String>),
    /// No path template matches.
    NoPath,
    /// The path exists, the method does not.
    NoMethod,
}

/// The spec: operations and the rewritten components.
pub(crate) struct Spec {
    name: &'static str,
    nested_href: bool,
    ops: Vec<Operation>,
    request_components: Value,
    response_components: Value,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spec({} operations)", self.ops.len())
    }
}

fn resolve<'a>(doc: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix('#')
            .and_then(|ptr| doc.pointer(ptr))
            .unwrap_or_else(|| panic!("the bundle's reference {r} does not resolve")),
        None => node,
    }
}

fn kind_of(doc: &Value, schema: &Value) -> Kind {
    let schema = resolve(doc, schema);
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        Some("object") => Kind::Object,
        Some("array") => Kind::Array(Box::new(
            schema
                .get("items")
                .map_or(Kind::Text, |items| kind_of(doc, items)),
        )),
        _ => Kind::Text,
    }
}

impl Spec {
    /// Parses an OpenAPI 3.0 document (YAML or JSON) as `opts` says.
    ///
    /// # Panics
    /// If the text does not parse or lacks `components.schemas` or
    /// `paths`: the documents are vendored, so that is a broken checkout.
    pub fn load(text: &str, opts: &SpecOptions) -> Spec {
        let mut doc: Value = serde_norway::from_str(text)
            .unwrap_or_else(|e| panic!("the vendored {} spec parses: {e}", opts.name));
        if let Some(relax) = opts.relax {
            relax(&mut doc);
        }
        let href = opts.nested_href;
        let schemas = doc
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .expect("the spec has components.schemas");
        let mut parts = BTreeSet::new();
        collect_all_of_parts(&doc, &mut parts);
        let components = |mode| {
            let converted: Map<String, Value> = schemas
                .iter()
                .map(|(name, s)| (name.clone(), convert(s, mode, parts.contains(name), href)))
                .collect();
            json!({ "schemas": converted })
        };
        let mut ops = Vec::new();
        let paths = doc["paths"].as_object().expect("the spec has paths");
        for (template, item) in paths {
            let item = item.as_object().expect("a path item is an object");
            let shared: Vec<Value> = item
                .get("parameters")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (method, op) in item {
                if !matches!(
                    method.as_str(),
                    "get" | "put" | "post" | "delete" | "patch" | "head" | "options"
                ) {
                    continue;
                }
                ops.push(Operation::parse(&doc, template, method, op, &shared));
            }
        }
        Spec {
            name: opts.name,
            nested_href: href,
            ops,
            request_components: components(Mode::Request),
            response_components: components(Mode::Response),
        }
    }

    /// The operation `method path` names; `path` is relative to
    /// [`BASE_PATH`]. Among several matching templates the one with the
    /// most literal segments wins (`/ports/{id}/vlan-assignments/batches`
    /// over `…/{assignment_id}`).
    pub fn lookup(&self, method: &str, path: &str) -> Lookup<'_> {
        let parts: Vec<&str> = match path.strip_prefix('/') {
            Some(rest) => rest.split('/').collect(),
            None => return Lookup::NoPath,
        };
        if parts.iter().any(|p| p.is_empty()) {
            return Lookup::NoPath;
        }
        let mut best: Option<(usize, &Operation, BTreeMap<String, String>)> = None;
        let mut path_exists = false;
        for op in &self.ops {
            let Some(params) = op.match_path(&parts) else {
                continue;
            };
            path_exists = true;
            if !op.method.eq_ignore_ascii_case(method) {
                continue;
            }
            let literals = op
                .segments
                .iter()
                .filter(|s| matches!(s, Segment::Literal(_)))
                .count();
            if best.as_ref().is_none_or(|(n, _, _)| literals > *n) {
                best = Some((literals, op, params));
            }
        }
        match best {
            Some((_, op, params)) => Lookup::Found(op, params),
            None if path_exists => Lookup::NoMethod,
            None => Lookup::NoPath,
        }
    }

    /// The operation with this `operationId`.
    pub fn operation(&self, id: &str) -> Option<&Operation> {
        self.ops.iter().find(|op| op.id == id)
    }

    fn compile(&self, mode: Mode, schema: Value) -> Validator {
        let mut root = match schema {
            Value::Object(map) => map,
            other => {
                let mut map = Map::new();
                map.insert("allOf".into(), Value::Array(vec![other]));
                map
            }
        };
        root.insert("$schema".into(), DRAFT_2020_12.into());
        root.insert(
            "components".into(),
            match mode {
                Mode::Request => self.request_components.clone(),
                Mode::Response => self.response_components.clone(),
            },
        );
        jsonschema::options()
            .with_draft(Draft::Draft202012)
            .should_validate_formats(true)
            .build(&Value::Object(root))
            .unwrap_or_else(|e| {
                panic!(
                    "a schema of the vendored {} spec does not compile: {e}",
                    self.name
                )
            })
    }
}

fn collect_all_of_parts(node: &Value, out: &mut BTreeSet<String>) {
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "allOf" {
                    for part in v.as_array().into_iter().flatten() {
                        if let Some(name) = part
                            .get("$ref")
                            .and_then(Value::as_str)
                            .and_then(|r| r.strip_prefix("#/components/schemas/"))
                        {
                            out.insert(name.to_owned());
                        }
                    }
                }
                collect_all_of_parts(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_all_of_parts(v, out)),
        _ => {}
    }
}

/// Rewrites one OpenAPI 3.0 schema node as JSON Schema 2020-12 (see the
/// module docs); `open` keeps an object schema open in [`Mode::Request`]
/// (it is an `allOf` part); `href` lets a nested referenced object of an
/// answer be `{"href"}` alone ([`SpecOptions::nested_href`]).
pub(crate) fn convert(node: &Value, mode: Mode, open: bool, href: bool) -> Value {
    let Some(obj) = node.as_object() else {
        return node.clone();
    };
    if let Some(r) = obj.get("$ref") {
        return json!({ "$ref": r });
    }
    let mut out = Map::new();
    let mut any_of: Vec<Value> = Vec::new();
    for (k, v) in obj {
        match k.as_str() {
            "properties" => {
                let props = v
                    .as_object()
                    .map(|p| {
                        p.iter()
                            .map(|(name, s)| (name.clone(), nested(s, mode, href)))
                            .collect::<Map<String, Value>>()
                    })
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" => {
                out.insert(k.clone(), nested(v, mode, href));
            }
            "not" => {
                out.insert(k.clone(), convert(v, mode, false, href));
            }
            "additionalProperties" => {
                out.insert(k.clone(), convert(v, mode, false, href));
            }
            "allOf" => {
                let parts = v.as_array().into_iter().flatten();
                out.insert(
                    k.clone(),
                    parts
                        .map(|p| convert(p, mode, true, href))
                        .collect::<Value>(),
                );
            }
            "oneOf" | "anyOf" => {
                let branches = v.as_array().into_iter().flatten();
                let converted: Vec<Value> =
                    branches.map(|b| convert(b, mode, false, href)).collect();
                if any_of.is_empty() {
                    any_of = converted;
                } else {
                    // Both keywords: each must hold.
                    out.insert(
                        "allOf".into(),
                        json!([{ "anyOf": std::mem::take(&mut any_of) }, { "anyOf": converted }]),
                    );
                }
            }
            "nullable" | "example" | "discriminator" | "xml" | "externalDocs" | "deprecated"
            | "readOnly" | "writeOnly" => {}
            _ if k.starts_with("x-") => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if !any_of.is_empty() {
        out.insert("anyOf".into(), Value::Array(any_of));
    }
    if obj.get("nullable") == Some(&Value::Bool(true)) {
        if let Some(t) = out.get("type").and_then(Value::as_str) {
            let t = t.to_owned();
            out.insert("type".into(), json!([t, "null"]));
        }
        if let Some(Value::Array(options)) = out.get_mut("enum") {
            options.push(Value::Null);
        }
    }
    let object_like = obj.contains_key("properties") || obj.contains_key("allOf");
    if mode == Mode::Request && !open && object_like && !obj.contains_key("additionalProperties") {
        out.insert("unevaluatedProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

/// A nested schema (a property or array items): in answers with `href`
/// (Metal), a referenced object may also come back as `{"href": …}` only,
/// the form Metal's introduction gives for nested objects not asked for
/// with `include` (the referenced schemas' own `required` lists would
/// refuse it).
fn nested(node: &Value, mode: Mode, href: bool) -> Value {
    let converted = convert(node, mode, false, href);
    if href && mode == Mode::Response && converted.get("$ref").is_some() {
        json!({ "anyOf": [converted, {
            "type": "object",
            "required": ["href"],
            "properties": { "href": { "type": "string" } },
            "additionalProperties": false
        }] })
    } else {
        converted
    }
}

fn schema_name(schema: &Value, i: usize) -> String {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
        .map_or_else(|| format!("branch {}", i + 1), str::to_owned)
}

/// Validators of one schema: one per `oneOf`/`anyOf` branch at its root
/// (so that a failure is reported branch by branch), else one.
struct Checker {
    branches: Vec<(String, Validator)>,
}

impl Checker {
    fn build(spec: &Spec, mode: Mode, schema: &Value) -> Checker {
        let roots = schema
            .get("oneOf")
            .or_else(|| schema.get("anyOf"))
            .and_then(Value::as_array);
        let branches = match roots {
            Some(branches) => branches
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    (
                        schema_name(b, i),
                        spec.compile(mode, convert(b, mode, false, spec.nested_href)),
                    )
                })
                .collect(),
            None => vec![(
                schema_name(schema, 0),
                spec.compile(mode, convert(schema, mode, false, spec.nested_href)),
            )],
        };
        Checker { branches }
    }

    /// Nothing if any branch accepts `value`, else every branch's errors.
    fn check(&self, value: &Value) -> Vec<String> {
        if self.branches.iter().any(|(_, v)| v.is_valid(value)) {
            return Vec::new();
        }
        let several = self.branches.len() > 1;
        let mut problems = Vec::new();
        for (name, v) in &self.branches {
            for e in v.iter_errors(value) {
                let text = describe(&e);
                problems.push(if several {
                    format!("as {name}: {text}")
                } else {
                    text
                });
            }
        }
        problems
    }
}

/// One `jsonschema` error as text: `at /cidr: "x" is not of type "integer"`.
fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    let at = e.instance_path().as_str();
    if at.is_empty() {
        e.to_string()
    } else {
        format!("at {at}: {e}")
    }
}

impl Operation {
    fn parse(doc: &Value, template: &str, method: &str, op: &Value, shared: &[Value]) -> Operation {
        // A few operations have no operationId: "METHOD template" names them.
        let id = op["operationId"].as_str().map_or_else(
            || format!("{} {template}", method.to_ascii_uppercase()),
            str::to_owned,
        );
        let segments = template
            .trim_start_matches('/')
            .split('/')
            .map(
                |s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) => Segment::Param(name.to_owned()),
                    None => Segment::Literal(s.to_owned()),
                },
            )
            .collect();
        let mut params: Vec<Param> = Vec::new();
        let declared = op
            .get("parameters")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for p in shared.iter().chain(declared) {
            let p = resolve(doc, p);
            let name = p["name"]
                .as_str()
                .expect("a parameter has a name")
                .to_owned();
            let location = match p["in"].as_str() {
                Some("path") => In::Path,
                Some("query") => In::Query,
                _ => In::Other,
            };
            let schema = p.get("schema").cloned().unwrap_or(json!({}));
            let style = p.get("style").and_then(Value::as_str).unwrap_or("form");
            let param = Param {
                kind: kind_of(doc, &schema),
                required: location == In::Path
                    || p.get("required").and_then(Value::as_bool) == Some(true),
                explode: p
                    .get("explode")
                    .and_then(Value::as_bool)
                    .unwrap_or(style == "form"),
                deep_object: style == "deepObject",
                name,
                location,
                schema,
            };
            // An operation's parameter overrides a path-level one.
            params.retain(|q| q.name != param.name || q.location != param.location);
            params.push(param);
        }
        let body = op.get("requestBody").map(|rb| {
            let rb = resolve(doc, rb);
            Body {
                required: rb.get("required").and_then(Value::as_bool) == Some(true),
                schema: rb
                    .pointer("/content/application~1json/schema")
                    .cloned()
                    .unwrap_or(json!({})),
            }
        });
        let responses = op
            .get("responses")
            .and_then(Value::as_object)
            .map(|r| {
                r.iter()
                    .map(|(code, resp)| {
                        let resp = resolve(doc, resp);
                        let schema = resp.pointer("/content/application~1json/schema").cloned();
                        (code.clone(), schema)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Operation {
            id,
            method: method.to_ascii_uppercase(),
            template: template.to_owned(),
            segments,
            params,
            body,
            responses,
            params_validator: OnceLock::new(),
            body_checker: OnceLock::new(),
            response_checkers: Mutex::new(HashMap::new()),
        }
    }

    fn match_path(&self, parts: &[&str]) -> Option<BTreeMap<String, String>> {
        if parts.len() != self.segments.len() {
            return None;
        }
        let mut params = BTreeMap::new();
        for (seg, part) in self.segments.iter().zip(parts) {
            match seg {
                Segment::Literal(l) if l == part => {}
                Segment::Literal(_) => return None,
                Segment::Param(name) => {
                    let value = percent_decode_str(part).decode_utf8_lossy().into_owned();
                    params.insert(name.clone(), value);
                }
            }
        }
        Some(params)
    }

    /// The declared default of a query parameter, if any.
    pub fn query_default(&self, name: &str) -> Option<&Value> {
        self.params
            .iter()
            .find(|p| p.location == In::Query && p.name == name)
            .and_then(|p| p.schema.get("default"))
    }

    /// Checks the path parameters and the (decoded) query pairs; returns
    /// every problem found.
    pub fn check_params(
        &self,
        spec: &Spec,
        path: &BTreeMap<String, String>,
        query: &[(String, String)],
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let mut path_obj = Map::new();
        for (name, value) in path {
            let kind = self
                .params
                .iter()
                .find(|p| p.location == In::Path && &p.name == name)
                .map_or(Kind::Text, |p| p.kind.clone());
            path_obj.insert(name.clone(), coerce(&kind, value));
        }
        let mut query_obj = Map::new();
        let mut grouped: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (k, v) in query {
            if !grouped.contains_key(k.as_str()) {
                order.push(k);
            }
            grouped.entry(k).or_default().push(v);
        }
        for key in order {
            let values = &grouped[key];
            let deep = key
                .split_once('[')
                .filter(|(_, rest)| rest.ends_with(']'))
                .and_then(|(name, rest)| {
                    self.params
                        .iter()
                        .find(|p| p.location == In::Query && p.deep_object && p.name == name)
                        .map(|p| (p, rest.trim_end_matches(']')))
                });
            if let Some((p, field)) = deep {
                let entry = query_obj
                    .entry(p.name.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(fields) = entry {
                    fields.insert(field.to_owned(), Value::String(values[0].to_owned()));
                }
                continue;
            }
            let Some(p) = self
                .params
                .iter()
                .find(|p| p.location == In::Query && p.name == key)
            else {
                problems.push(format!(
                    "query parameter {key:?} is not declared by {} {}",
                    self.method, self.template
                ));
                continue;
            };
            let value = match &p.kind {
                Kind::Array(item) => {
                    let items: Vec<Value> = if p.explode {
                        values.iter().map(|v| coerce(item, v)).collect()
                    } else {
                        if values.len() > 1 {
                            problems.push(format!(
                                "query parameter {key:?} is given {} times; it takes one comma-separated list",
                                values.len()
                            ));
                        }
                        values[0]
                            .split(',')
                            .filter(|s| !s.is_empty())
                            .map(|v| coerce(item, v))
                            .collect()
                    };
                    Value::Array(items)
                }
                kind => {
                    if values.len() > 1 {
                        problems.push(format!(
                            "query parameter {key:?} is given {} times; it takes one value",
                            values.len()
                        ));
                    }
                    coerce(kind, values[0])
                }
            };
            query_obj.insert(p.name.clone(), value);
        }
        for p in &self.params {
            if p.required && p.location == In::Query && !query_obj.contains_key(&p.name) {
                problems.push(format!("query parameter {:?} is required", p.name));
            }
        }
        let instance = json!({ "path": path_obj, "query": query_obj });
        let validator = self.params_validator.get_or_init(|| {
            let section = |location: In| {
                let props: Map<String, Value> = self
                    .params
                    .iter()
                    .filter(|p| p.location == location)
                    .map(|p| {
                        let s = convert(&p.schema, Mode::Request, false, spec.nested_href);
                        (p.name.clone(), s)
                    })
                    .collect();
                json!({ "type": "object", "properties": props })
            };
            spec.compile(
                Mode::Request,
                json!({
                    "type": "object",
                    "properties": { "path": section(In::Path), "query": section(In::Query) }
                }),
            )
        });
        for e in validator.iter_errors(&instance) {
            let at = e.instance_path().as_str();
            let at = at
                .strip_prefix("/path/")
                .map(|p| format!("path parameter {p}"))
                .or_else(|| {
                    at.strip_prefix("/query/")
                        .map(|q| format!("query parameter {q}"))
                })
                .unwrap_or_else(|| at.to_owned());
            problems.push(format!("{at}: {e}"));
        }
        problems
    }

    /// Whether the operation's request body is required.
    pub fn body_required(&self) -> bool {
        self.body.as_ref().is_some_and(|b| b.required)
    }

    /// Checks a JSON request body; a `oneOf`/`anyOf` body is valid when any
    /// branch is, and its problems are reported per branch.
    pub fn check_body(&self, spec: &Spec, body: &Value) -> Vec<String> {
        let Some(declared) = &self.body else {
            return vec![format!(
                "{} {} takes no request body",
                self.method, self.template
            )];
        };
        self.body_checker
            .get_or_init(|| Checker::build(spec, Mode::Request, &declared.schema))
            .check(body)
    }

    /// Checks an answer against the declared response for `status`;
    /// statuses the operation does not declare are not checked.
    pub fn check_response(&self, spec: &Spec, status: u16, body: Option<&Value>) -> Vec<String> {
        let code = status.to_string();
        let Some(schema) = self.responses.get(&code) else {
            return Vec::new();
        };
        let Some(schema) = schema else {
            return match body {
                Some(_) => vec![format!("{status} is declared without a body")],
                None => Vec::new(),
            };
        };
        let Some(body) = body else {
            return vec![format!(
                "{status} is declared with a JSON body; none was sent"
            )];
        };
        let cached = self
            .response_checkers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&code)
            .cloned();
        // Compiled outside the lock (another thread may compile it too).
        let checker = cached.unwrap_or_else(|| {
            let built = Arc::new(Checker::build(spec, Mode::Response, schema));
            self.response_checkers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(code, Arc::clone(&built));
            built
        });
        checker.check(body)
    }
}

/// A parameter's text as the JSON value its schema expects; text that does
/// not parse stays a string, so that validation reports the wrong type.
fn coerce(kind: &Kind, text: &str) -> Value {
    match kind {
        Kind::Integer => text
            .parse::<i64>()
            .map_or_else(|_| Value::String(text.to_owned()), Value::from),
        Kind::Number => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.to_owned()), Value::Number),
        Kind::Boolean => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::String(text.to_owned()),
        },
        Kind::Array(item) => Value::Array(vec![coerce(item, text)]),
        Kind::Text | Kind::Object => Value::String(text.to_owned()),
    }
}

/// Decodes a query string into pairs (`+` is a space, `%XX` escapes).
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nullable_one_of_and_closing() {
        let s = json!({
            "properties": {"a": {"type": "string", "nullable": true, "enum": ["x"]}},
            "oneOf": [{"$ref": "#/components/schemas/A", "description": "ignored"}],
            "x-thing": 1, "example": {}
        });
        assert_eq!(
            convert(&s, Mode::Request, false, true),
            json!({
                "properties": {"a": {"type": ["string", "null"], "enum": ["x", null]}},
                "anyOf": [{"$ref": "#/components/schemas/A"}],
                "unevaluatedProperties": false
            })
        );
        let open = convert(&s, Mode::Response, false, true);
        assert!(open.get("unevaluatedProperties").is_none());
        assert!(convert(&s, Mode::Request, true, true)
            .get("unevaluatedProperties")
            .is_none());
    }

    #[test]
    fn paths_match_the_most_literal_template() {
        let spec = spec();
        let Lookup::Found(op, params) = spec.lookup("POST", "/projects/p%2D1/ips") else {
            panic!("no match")
        };
        assert_eq!(op.id, "requestIPReservation");
        assert_eq!(params["id"], "p-1");
        let Lookup::Found(op, _) = spec.lookup("GET", "/ports/x/vlan-assignments/batches") else {
            panic!("no match")
        };
        assert_eq!(op.id, "findPortVlanAssignmentBatches");
        assert!(matches!(spec.lookup("PATCH", "/vrfs/x"), Lookup::NoMethod));
        assert!(matches!(spec.lookup("GET", "/vrfs/x/nope"), Lookup::NoPath));
        assert!(matches!(spec.lookup("GET", "/vrfs/"), Lookup::NoPath));
    }

    #[test]
    fn every_emulated_operation_is_in_the_spec() {
        for id in super::super::state::EMULATED {
            assert!(spec().operation(id).is_some(), "{id}");
        }
    }

    #[test]
    fn query_pairs_decode() {
        assert_eq!(
            parse_query("types=vrf&types=public_ipv4&include=a%2Cb&x=a+b"),
            [
                ("types".into(), "vrf".into()),
                ("types".into(), "public_ipv4".into()),
                ("include".into(), "a,b".into()),
                ("x".into(), "a b".into()),
            ]
        );
    }
}
