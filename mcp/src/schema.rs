//! Output schemas as clients validate them cheaply.
//!
//! The Python SDK validates every `structuredContent` against the tool's `outputSchema` with
//! `jsonschema`, in pure Python: with schemars' full schema of `execute_code`'s result
//! (`$ref`s into `$defs`, nested objects, `format`/`minimum` keywords) that took about
//! 0.55 ms per call, five times flowrepl's whole round trip. [`shallow`] keeps what a
//! client needs to know, each top-level field's JSON type(s), description, and enum values,
//! and describes nested objects by their type only (their fields are documented in
//! `docs/mcp.md` and the JSON-RPC docs).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The shallow output schema of `T` (an object type).
pub fn shallow<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let full = schema_for_output::<T>();
    Arc::new(flatten(&full))
}

/// The shallow output schema of a result that is either an `A` or a `B`: the properties of
/// both, and required only what both require.
pub fn either<A: JsonSchema + 'static, B: JsonSchema + 'static>() -> Arc<JsonObject> {
    let (a, b) = (shallow::<A>(), shallow::<B>());
    let mut out = (*a).clone();
    if let (Some(Value::Object(pa)), Some(pb)) = (
        out.get_mut("properties"),
        b.get("properties").and_then(Value::as_object),
    ) {
        for (k, v) in pb {
            pa.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let names = |s: &JsonObject| -> BTreeSet<String> {
        s.get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let both: Vec<Value> = names(&a)
        .intersection(&names(&b))
        .map(|n| json!(n))
        .collect();
    out.insert("required".into(), Value::Array(both));
    Arc::new(out)
}

fn flatten(full: &JsonObject) -> JsonObject {
    let empty = Map::new();
    let defs = full
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut props = Map::new();
    if let Some(p) = full.get("properties").and_then(Value::as_object) {
        for (name, schema) in p {
            props.insert(name.clone(), shallow_property(schema, defs));
        }
    }
    let mut out = Map::new();
    out.insert("type".into(), json!("object"));
    out.insert("properties".into(), Value::Object(props));
    if let Some(r) = full.get("required") {
        out.insert("required".into(), r.clone());
    }
    out
}

fn shallow_property(schema: &Value, defs: &Map<String, Value>) -> Value {
    let mut types = BTreeSet::new();
    let mut values = Vec::new();
    collect(schema, defs, &mut types, &mut values, 0);
    let mut p = Map::new();
    if let Some(d) = schema.get("description") {
        p.insert("description".into(), d.clone());
    }
    let types: Vec<&str> = types.into_iter().collect();
    match types.as_slice() {
        [] => {}
        [one] => {
            p.insert("type".into(), json!(one));
        }
        many => {
            p.insert("type".into(), json!(many));
        }
    }
    if !values.is_empty() {
        if p.get("type").is_some_and(|t| t.as_array().is_some()) {
            values.push(Value::Null);
        }
        p.insert("enum".into(), Value::Array(values));
    }
    Value::Object(p)
}

/// Gathers the JSON types a schema allows (following `$ref`, `anyOf`, `oneOf`), and the
/// values of string enums.
fn collect(
    s: &Value,
    defs: &Map<String, Value>,
    types: &mut BTreeSet<&'static str>,
    values: &mut Vec<Value>,
    depth: u32,
) {
    if depth > 8 {
        return;
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        if let Some(target) = r.strip_prefix("#/$defs/").and_then(|n| defs.get(n)) {
            collect(target, defs, types, values, depth + 1);
        }
    }
    let mut add = |t: &str| {
        for known in [
            "object", "array", "string", "integer", "number", "boolean", "null",
        ] {
            if t == known {
                types.insert(known);
            }
        }
    };
    match s.get("type") {
        Some(Value::String(t)) => add(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).for_each(add),
        _ => {}
    }
    if let Some(c) = s.get("const") {
        if c.is_string() {
            types.insert("string");
            values.push(c.clone());
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        values.extend(e.iter().filter(|v| v.is_string()).cloned());
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            for a in alts {
                collect(a, defs, types, values, depth + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::McpExecuteResult;

    #[test]
    fn execute_result_schema_is_flat_and_typed() {
        let s = shallow::<McpExecuteResult>();
        let text = serde_json::to_string(&*s).unwrap();
        assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
        let p = s["properties"].as_object().unwrap();
        assert_eq!(p["stdout"]["type"], "string");
        assert_eq!(p["result"]["type"], json!(["null", "string"]));
        assert_eq!(p["mode"]["enum"], json!(["in_process", "worker"]));
        assert_eq!(p["stopped_by"]["enum"], json!(["interrupt", "kill", null]));
        assert_eq!(p["error"]["type"], json!(["null", "object"]));
        assert_eq!(p["usage"]["type"], "object");
        assert_eq!(p["images"]["type"], "array");
        let required: Vec<&str> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(required.contains(&"success") && required.contains(&"output_cut"));
    }
}
