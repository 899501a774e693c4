//! JSON Schemas of the records, generated from their types, so that the published schema
//! cannot drift from what the kernel writes and reads. `docs/schema/v1/execution.schema.json`
//! is [`execution_schema`]'s output (a test compares them).
//!
//! The schema describes what a reader may rely on (serde's deserialization contract): a
//! field added within the version after records were written (`rebound_vars`, `pid`, ...) is
//! not required. Nested objects allow no other fields; the record itself does (fields are
//! only ever added within a version).

use crate::record::ExecutionRecord;
use schemars::generate::{Contract, SchemaSettings};
use serde_json::{json, Value};

/// Where the published schemas say they live (`$id`s; not fetched from anywhere).
pub const SCHEMA_BASE: &str = "https://flowrepl.invalid/schema/v1/";

/// The JSON Schema (draft 2020-12) of an execution record.
pub fn execution_schema() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.contract = Contract::Deserialize;
        })
        .into_generator();
    let mut schema = generator
        .into_root_schema_for::<ExecutionRecord<'static>>()
        .to_value();
    close_nested(&mut schema, true);
    let fields = schema.as_object_mut().expect("a schema object");
    fields.insert(
        "$id".into(),
        json!(format!("{SCHEMA_BASE}execution.schema.json")),
    );
    fields.insert(
        "title".into(),
        json!("flowrepl task log: one execute_code call (type execution)"),
    );
    schema
}

/// `additionalProperties: false` on every object schema with `properties` below the root.
fn close_nested(schema: &mut Value, root: bool) {
    match schema {
        Value::Object(fields) => {
            if !root && fields.contains_key("properties") {
                fields
                    .entry("additionalProperties")
                    .or_insert(Value::Bool(false));
            }
            for (_, v) in fields.iter_mut() {
                close_nested(v, false);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| close_nested(v, false)),
        _ => {}
    }
}

/// The field table of a record schema, as docs/task-log.md shows it: one row per property,
/// `| field | type | meaning |`, the fields of nested objects as `parent.field` (and
/// `parent[].field` for arrays of objects) after their parent.
pub fn field_table(schema: &Value) -> String {
    let mut out = String::from("| field | type | meaning |\n| --- | --- | --- |\n");
    rows(schema, "", &mut out);
    out
}

fn rows(schema: &Value, prefix: &str, out: &mut String) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, p) in schema["properties"].as_object().into_iter().flatten() {
        let mut kind = type_name(p);
        if !required.contains(&name.as_str()) {
            kind.push_str(", optional");
        }
        let meaning = p["description"]
            .as_str()
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        out.push_str(&format!("| `{prefix}{name}` | {kind} | {meaning} |\n"));
        if p.get("properties").is_some() {
            rows(p, &format!("{prefix}{name}."), out);
        } else if p["items"].get("properties").is_some() {
            rows(&p["items"], &format!("{prefix}{name}[]."), out);
        }
    }
}

/// `string`, `string or null`, `array of strings`, `object`, ...
fn type_name(p: &Value) -> String {
    let one = |t: &str, p: &Value| match t {
        "array" => format!("array of {}s", type_name(&p["items"])),
        "integer" => "int".to_owned(),
        "number" => "float".to_owned(),
        "boolean" => "bool".to_owned(),
        other => other.to_owned(),
    };
    match &p["type"] {
        Value::String(t) => one(t, p),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(|t| one(t, p))
            .collect::<Vec<_>>()
            .join(" or "),
        _ if p.get("anyOf").is_some() || p.get("oneOf").is_some() => {
            let alts = p.get("anyOf").or_else(|| p.get("oneOf")).unwrap();
            alts.as_array()
                .into_iter()
                .flatten()
                .map(type_name)
                .collect::<Vec<_>>()
                .join(" or ")
        }
        _ if p.get("const").is_some() => "const".to_owned(),
        _ => "any".to_owned(),
    }
}
