//! The JSON Schema of the config file, generated from the serde types that parse it (`schema`),
//! so it cannot drift from what Weir accepts. `weir schema` prints it; docs/weir.schema.json is
//! the committed copy editors use (taplo / Even Better TOML, see docs/operating.md).

use schemars::generate::SchemaSettings;
use serde_json::Value;

use super::schema::File;

/// The schema's `$id`.
pub const SCHEMA_ID: &str = "urn:weir:config:v1";

/// The schema as pretty-printed JSON text, ending in a newline.
pub fn json_schema_text() -> String {
    let mut schema = SchemaSettings::draft07().into_generator().into_root_schema_for::<File>();
    // A stable name for the schema wherever a copy lives (docs/weir.schema.json, the Debian
    // package's /usr/share/weir, a schema store); `v1` changes only with an incompatible file.
    schema.insert("$id".into(), SCHEMA_ID.into());
    schema.insert("title".into(), "Weir configuration".into());
    schema.insert(
        "description".into(),
        "The TOML config of Weir, a rate-limiting reverse proxy (README.md: Configuration reference). \
         String values may use ${NAME} from the environment."
            .into(),
    );
    let mut value = schema.to_value();
    tidy(&mut value);
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// What schemars generates, made to fit TOML and `${NAME}`:
/// - an optional setting is absent, never `null` (TOML has no null): the `null` that schemars
///   adds to `Option` types goes, so editors do not offer it;
/// - a setting with a fixed set of values also accepts a string naming a variable, as Weir does;
/// - descriptions are doc comments with their line breaks undone.
fn tidy(value: &mut Value) {
    match value {
        Value::Object(map) => {
            // Children first: what is added below is not visited again.
            map.values_mut().for_each(tidy);
            if let Some(Value::String(text)) = map.get_mut("description") {
                *text = text.split("\n\n").map(|p| p.replace('\n', " ")).collect::<Vec<_>>().join("\n\n");
            }
            if let Some(Value::Array(values)) = map.remove("enum") {
                let from_env = serde_json::json!({ "type": "string", "pattern": "\\$\\{" });
                map.insert("anyOf".into(), serde_json::json!([{ "enum": values }, from_env]));
            }
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(any)) = map.get_mut("anyOf") {
                any.retain(|s| s.get("type").is_none_or(|t| t != "null"));
                if any.len() == 1 {
                    if let Some(Value::Object(only)) = any.pop() {
                        map.remove("anyOf");
                        map.extend(only);
                    }
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}
