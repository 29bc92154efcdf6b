//! Every error of a config at once, for `weir check`: values of the wrong shape (an unknown
//! field, a wrong type, a word not in a setting's list) are found by the JSON Schema (`weir
//! schema`), which reports each of them where serde stops at the first; each gets the line of
//! its value or key. An error on a line whose value came from `${NAME}` names the variable.

use std::ops::Range;

use jsonschema::error::ValidationErrorKind;
use toml_edit::{ImDocument, Item, Value};

use super::error::{ConfigError, Source};

/// The schema errors of `src`'s text (already interpolated), each with its line; empty when the
/// text is not TOML (the parser's error says where) or matches the schema.
pub fn schema_errors(src: &Source<'_>) -> Vec<ConfigError> {
    let Ok(doc) = ImDocument::parse(src.text) else { return Vec::new() };
    let Ok(value) = toml::from_str::<toml::Value>(src.text) else { return Vec::new() };
    let Ok(instance) = serde_json::to_value(value) else { return Vec::new() };
    let Ok(schema) = serde_json::from_str::<serde_json::Value>(&super::json_schema_text()) else { return Vec::new() };
    let Ok(validator) = jsonschema::draft7::new(&schema) else { return Vec::new() };
    validator
        .iter_errors(&instance)
        .map(|e| {
            let pointer: Vec<String> = e.instance_path().to_string().split('/').skip(1).map(unescape).collect();
            let unexpected = match e.kind() {
                ValidationErrorKind::AdditionalProperties { unexpected } => unexpected.first().cloned(),
                _ => None,
            };
            let span = span_of(doc.as_item(), &pointer, unexpected.as_deref());
            let setting = setting_name(&pointer);
            let message = match (&unexpected, setting.is_empty()) {
                (Some(key), true) => format!("{key}: unknown setting"),
                (Some(key), false) => format!("{setting}.{key}: unknown setting"),
                (None, true) => e.to_string(),
                (None, false) => format!("{setting}: {e}"),
            };
            match span {
                Some(span) => src.error_at(&span, message),
                None => src.error(message),
            }
        })
        .collect()
}

/// A JSON pointer segment, `~1` and `~0` undone.
fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// `route[2].limit_req[1].zone` from `/route/1/limit_req/0/zone` (1-based, as `${NAME}` errors
/// name settings).
fn setting_name(pointer: &[String]) -> String {
    let mut out = String::new();
    for segment in pointer {
        match segment.parse::<usize>() {
            Ok(i) => out.push_str(&format!("[{}]", i + 1)),
            Err(_) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(segment);
            }
        }
    }
    out
}

/// Where the value at `pointer` is in the text (the key `unexpected` of it, when given).
fn span_of(root: &Item, pointer: &[String], unexpected: Option<&str>) -> Option<Range<usize>> {
    enum At<'a> {
        Item(&'a Item),
        Value(&'a Value),
        Table(&'a toml_edit::Table),
    }
    let mut at = At::Item(root);
    for segment in pointer {
        let index = segment.parse::<usize>().ok();
        at = match at {
            At::Item(Item::Table(t)) | At::Table(t) => At::Item(t.get(segment)?),
            At::Item(Item::ArrayOfTables(a)) => At::Table(a.get(index?)?),
            At::Item(Item::Value(v)) | At::Value(v) => match v {
                Value::Array(a) => At::Value(a.get(index?)?),
                Value::InlineTable(t) => At::Value(t.get(segment)?),
                _ => return None,
            },
            At::Item(_) => return None,
        };
    }
    let key_span = |key: Option<&toml_edit::Key>| key.and_then(|k| k.span());
    match (at, unexpected) {
        (At::Item(Item::Table(t)) | At::Table(t), Some(key)) => key_span(t.key(key)).or_else(|| t.span()),
        (At::Item(Item::Value(Value::InlineTable(t))) | At::Value(Value::InlineTable(t)), Some(key)) => {
            key_span(t.key(key)).or_else(|| t.span())
        }
        (At::Item(Item::Table(t)) | At::Table(t), None) => t.span(),
        (At::Item(Item::Value(v)) | At::Value(v), _) => v.span(),
        (At::Item(item), _) => item.span(),
    }
}

/// `message` with the variables its line's values came from, unless it names them already.
pub fn name_variables(message: &str, variables: &[String]) -> String {
    let missing: Vec<String> =
        variables.iter().map(|v| format!("${{{v}}}")).filter(|v| !message.contains(v.as_str())).collect();
    if missing.is_empty() {
        message.to_string()
    } else {
        format!("{message} (the value came from {})", missing.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Fixed;

    fn errors(text: &str) -> Vec<String> {
        let outside = Fixed::default();
        schema_errors(&Source { file: "t.toml", text, outside: &outside }).iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn every_shape_error_with_its_line() {
        let text = "[server]\nlisten = [\"127.0.0.1:8080\"]\nthreads = \"2\"\nlisen = 1\n\n[[route]]\nname = \"a\"\n\
                    upstream = \"app\"\npath_prefx = \"/\"\nlimit_req = [ { zone = \"z\", brst = 1 } ]\n";
        let found = errors(text);
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(found.iter().any(|e| e.starts_with("t.toml:3: server.threads: ")), "{found:#?}");
        assert!(found.contains(&"t.toml:4: server.lisen: unknown setting".to_string()), "{found:#?}");
        assert!(found.contains(&"t.toml:9: route[1].path_prefx: unknown setting".to_string()), "{found:#?}");
        assert!(found.contains(&"t.toml:10: route[1].limit_req[1].brst: unknown setting".to_string()), "{found:#?}");
    }

    #[test]
    fn no_error_for_a_good_shape_or_a_syntax_error() {
        assert_eq!(errors("[server]\nlisten = [\"127.0.0.1:8080\"]\n"), Vec::<String>::new());
        assert_eq!(errors("[server\n"), Vec::<String>::new(), "the TOML parser reports that one");
    }

    #[test]
    fn names_the_variables_a_value_came_from() {
        let vars = ["RATE".to_string()];
        assert_eq!(name_variables("bad rate \"x\"", &vars), "bad rate \"x\" (the value came from ${RATE})");
        assert_eq!(name_variables("bad rate ${RATE}", &vars), "bad rate ${RATE}");
    }
}
