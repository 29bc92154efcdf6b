//! The JSON Schema of the config (`weir schema`, committed as docs/weir.schema.json for editors):
//! the committed copy is what the binary generates, every example in conf/ passes it, and a
//! typo or a wrong type does not.

use crate::support;

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

const SCHEMA_FILE: &str = "docs/weir.schema.json";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn committed_schema() -> Value {
    let text = fs::read_to_string(repo().join(SCHEMA_FILE)).expect("read docs/weir.schema.json");
    serde_json::from_str(&text).expect("docs/weir.schema.json is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&committed_schema()).expect("a valid draft-07 schema")
}

/// A TOML config as the JSON an editor's schema check sees.
fn as_json(toml_text: &str) -> Value {
    let value: toml::Value = toml::from_str(toml_text).expect("TOML");
    serde_json::to_value(value).expect("TOML to JSON")
}

fn errors(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator.iter_errors(instance).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

#[test]
fn committed_schema_is_the_generated_one() {
    let out = support::weir::run(["schema"], Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let committed = fs::read_to_string(repo().join(SCHEMA_FILE)).expect("read the committed schema");
    assert!(
        out.stdout == committed,
        "{SCHEMA_FILE} differs from `weir schema`: run `cargo run -- schema > {SCHEMA_FILE}` and commit it"
    );
}

#[test]
fn every_example_config_passes_the_schema() {
    let validator = validator();
    let mut checked = 0;
    for entry in fs::read_dir(repo().join("conf")).expect("conf/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let instance = as_json(&fs::read_to_string(&path).expect("read"));
        let found = errors(&validator, &instance);
        assert!(found.is_empty(), "{}: {found:#?}", path.display());
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} configs in conf/");
}

#[test]
fn typos_and_wrong_types_fail_the_schema() {
    let validator = validator();
    let routes = fs::read_to_string(repo().join("conf/routes.toml")).expect("conf/routes.toml");
    assert!(validator.is_valid(&as_json(&routes)));
    for (from, to, path) in [
        ("listen = [", "lisen = [", ""),
        ("path_prefix = ", "path_prefx = ", "/route/"),
        ("rate = \"", "rat = \"", "/limit_req_zone/"),
        ("threads = 2", "threads = \"2\"", "/server/threads"),
    ] {
        assert!(routes.contains(from), "conf/routes.toml has no {from:?}");
        let bad = as_json(&routes.replacen(from, to, 1));
        let found = errors(&validator, &bad);
        assert!(found.iter().any(|e| e.starts_with(path)), "{to:?} was not refused at {path:?}: {found:#?}");
    }
    // A setting with a fixed set of values: a misspelt one fails, `${NAME}` passes (Weir reads it).
    let redis = fs::read_to_string(repo().join("conf/redis.toml")).expect("conf/redis.toml");
    let on_error = "on_error = \"local\"";
    assert!(redis.contains(on_error));
    let found = errors(&validator, &as_json(&redis.replacen(on_error, "on_error = \"locl\"", 1)));
    assert!(found.iter().any(|e| e.starts_with("/store/on_error")), "{found:#?}");
    let from_env = as_json(&redis.replacen(on_error, "on_error = \"${ON_ERROR}\"", 1));
    assert_eq!(errors(&validator, &from_env), Vec::<String>::new());
}
