//! The live view's answers made safe for a terminal and a page: every string of a JSON document
//! through [`crate::safe_text::escape`].

use std::borrow::Cow;

use serde_json::Value;

pub use crate::safe_text::{escape, is_unsafe};

/// Every string of `value`, object keys included, through [`escape`].
pub fn escape_json(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Cow::Owned(safe) = escape(s) {
                *s = safe;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(escape_json),
        Value::Object(fields) => {
            if fields.keys().any(|k| k.chars().any(is_unsafe)) {
                let old = std::mem::take(fields);
                for (k, v) in old {
                    fields.insert(escape(&k).into_owned(), v);
                }
            }
            fields.values_mut().for_each(escape_json);
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_of_a_document_is_escaped() {
        let mut v = serde_json::json!({"zone\u{1b}": ["k\u{202e}", {"instance": "h\u{85}"}], "n": 1});
        escape_json(&mut v);
        assert_eq!(v, serde_json::json!({"zone\\u{1b}": ["k\\u{202e}", {"instance": "h\\u{85}"}], "n": 1}));
    }
}
