//! JSON Merge Patch (RFC 7386) and JSON Patch (RFC 6902), as the API server
//! applies them to custom resources.

use serde_json::{Map, Value};

/// Applies an RFC 7386 merge patch to `target` in place: objects merge
/// recursively, `null` removes a member, anything else (arrays included)
/// replaces the target value.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(object) = target else {
        unreachable!("made an object above")
    };
    for (key, value) in members {
        if value.is_null() {
            object.remove(key);
        } else {
            merge_patch(object.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Why a JSON Patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonPatchError {
    /// The patch document itself is malformed (not an array of operations,
    /// unknown `op`, missing `path`/`value`/`from`, bad pointer syntax).
    Malformed(String),
    /// A well-formed operation failed: a `test` did not match, or a path
    /// does not exist where it must.
    Failed(String),
}

/// Applies an RFC 6902 JSON Patch (`add`, `remove`, `replace`, `move`,
/// `copy`, `test`) to a copy of `target`; all or nothing.
pub(crate) fn json_patch(target: &Value, patch: &Value) -> Result<Value, JsonPatchError> {
    let Some(ops) = patch.as_array() else {
        return Err(JsonPatchError::Malformed(
            "a JSON patch must be an array of operations".into(),
        ));
    };
    let mut doc = target.clone();
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut doc, op).map_err(|e| match e {
            JsonPatchError::Malformed(m) => {
                JsonPatchError::Malformed(format!("operation {i}: {m}"))
            }
            JsonPatchError::Failed(m) => JsonPatchError::Failed(format!("operation {i}: {m}")),
        })?;
    }
    Ok(doc)
}

fn member<'a>(op: &'a Value, name: &str) -> Result<&'a Value, JsonPatchError> {
    op.get(name)
        .ok_or_else(|| JsonPatchError::Malformed(format!("missing {name:?}")))
}

fn pointer_member(op: &Value, name: &str) -> Result<Vec<String>, JsonPatchError> {
    let text = member(op, name)?
        .as_str()
        .ok_or_else(|| JsonPatchError::Malformed(format!("{name:?} must be a string")))?;
    parse_pointer(text)
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), JsonPatchError> {
    let name = member(op, "op")?
        .as_str()
        .ok_or_else(|| JsonPatchError::Malformed("\"op\" must be a string".into()))?;
    let path = pointer_member(op, "path")?;
    match name {
        "add" => add(doc, &path, member(op, "value")?.clone()),
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let value = member(op, "value")?.clone();
            let slot = resolve_mut(doc, &path)?;
            *slot = value;
            Ok(())
        }
        "move" => {
            let from = pointer_member(op, "from")?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(JsonPatchError::Failed(
                    "cannot move a value into one of its children".into(),
                ));
            }
            let value = remove(doc, &from)?;
            add(doc, &path, value)
        }
        "copy" => {
            let from = pointer_member(op, "from")?;
            let value = resolve_mut(doc, &from)?.clone();
            add(doc, &path, value)
        }
        "test" => {
            let expected = member(op, "value")?;
            let actual = resolve_mut(doc, &path)?;
            if json_equal(actual, expected) {
                Ok(())
            } else {
                Err(JsonPatchError::Failed(format!(
                    "test failed: {} is {actual}, not {expected}",
                    render_pointer(&path)
                )))
            }
        }
        other => Err(JsonPatchError::Malformed(format!(
            "unknown operation {other:?}"
        ))),
    }
}

/// Splits a JSON pointer into unescaped reference tokens.
fn parse_pointer(text: &str) -> Result<Vec<String>, JsonPatchError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = text.strip_prefix('/') else {
        return Err(JsonPatchError::Malformed(format!(
            "JSON pointer {text:?} must start with '/'"
        )));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn render_pointer(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, JsonPatchError> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let index: usize = if valid {
        token
            .parse()
            .map_err(|_| JsonPatchError::Failed(format!("array index {token:?} out of range")))?
    } else {
        return Err(JsonPatchError::Failed(format!(
            "{token:?} is not an array index"
        )));
    };
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if index > limit || (!allow_end && len == 0) {
        return Err(JsonPatchError::Failed(format!(
            "array index {index} out of range (length {len})"
        )));
    }
    Ok(index)
}

fn resolve_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, JsonPatchError> {
    let mut node = doc;
    for (depth, token) in path.iter().enumerate() {
        node = match node {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let i = array_index(token, items.len(), false)?;
                items.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| {
            JsonPatchError::Failed(format!(
                "path {} does not exist",
                render_pointer(&path[..=depth])
            ))
        })?;
    }
    Ok(node)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), JsonPatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match resolve_mut(doc, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let i = array_index(last, items.len(), true)?;
            items.insert(i, value);
            Ok(())
        }
        _ => Err(JsonPatchError::Failed(format!(
            "parent of {} is not an object or array",
            render_pointer(path)
        ))),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, JsonPatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(JsonPatchError::Failed(
            "cannot remove the whole document".into(),
        ));
    };
    let missing =
        || JsonPatchError::Failed(format!("path {} does not exist", render_pointer(path)));
    match resolve_mut(doc, parent)? {
        Value::Object(map) => map.remove(last).ok_or_else(missing),
        Value::Array(items) => {
            let i = array_index(last, items.len(), false)?;
            Ok(items.remove(i))
        }
        _ => Err(missing()),
    }
}

/// JSON equality as RFC 6902 `test` defines it: numbers compare by value.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || (x.as_f64().is_some() && x.as_f64() == y.as_f64())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386_examples() {
        // The examples of RFC 7386, appendix A (a selection).
        for (target, patch, result) in [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ] {
            let mut doc = target.clone();
            merge_patch(&mut doc, &patch);
            assert_eq!(doc, result, "{target} + {patch}");
        }
    }

    #[test]
    fn json_patch_operations() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"]}, "n": 1});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "test", "path": "/n", "value": 1.0},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "c"},
                {"op": "remove", "path": "/metadata/finalizers/0"},
                {"op": "replace", "path": "/n", "value": 2},
                {"op": "copy", "from": "/n", "path": "/m"},
                {"op": "move", "from": "/m", "path": "/metadata/a~1b"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["b", "c"], "a/b": 2}, "n": 2})
        );
    }

    #[test]
    fn json_patch_failures_leave_the_document_alone() {
        let doc = json!({"a": [1]});
        let err = json_patch(
            &doc,
            &json!([{"op": "add", "path": "/b", "value": 1},
                    {"op": "test", "path": "/a/0", "value": 2}]),
        )
        .unwrap_err();
        assert!(
            matches!(err, JsonPatchError::Failed(ref m) if m.contains("test failed")),
            "{err:?}"
        );
        for bad in [
            json!([{"op": "remove", "path": "/nope"}]),
            json!([{"op": "replace", "path": "/a/1", "value": 0}]),
            json!([{"op": "add", "path": "/a/01", "value": 0}]),
            json!([{"op": "move", "from": "/a", "path": "/a/0"}]),
        ] {
            assert!(
                matches!(json_patch(&doc, &bad), Err(JsonPatchError::Failed(_))),
                "{bad}"
            );
        }
        for malformed in [
            json!({"op": "add"}),
            json!([{"op": "frobnicate", "path": "/a"}]),
            json!([{"op": "add", "path": "a", "value": 1}]),
            json!([{"op": "add", "path": "/a"}]),
        ] {
            assert!(
                matches!(
                    json_patch(&doc, &malformed),
                    Err(JsonPatchError::Malformed(_))
                ),
                "{malformed}"
            );
        }
    }
}
