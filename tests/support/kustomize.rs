//! deploy/kubernetes rendered without kubectl: the subset of kustomize its kustomizations use
//! (`resources`, `replicas`, JSON 6902 `patches` on a `target` kind and name) — anything else in a
//! kustomization.yaml fails here, so the subset cannot be left behind silently. Where `kubectl`
//! exists, [`kubectl_kustomize`] gives its rendering to compare with.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Every object `dir`'s kustomization produces, as JSON values.
pub fn render(dir: &Path) -> Vec<Value> {
    let file = dir.join("kustomization.yaml");
    let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let k: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let fields = k.as_object().unwrap_or_else(|| panic!("{}: not a map", file.display()));
    for key in fields.keys() {
        assert!(
            ["apiVersion", "kind", "resources", "replicas", "patches"].contains(&key.as_str()),
            "{}: {key} is beyond what tests/support/kustomize.rs renders: extend it",
            file.display()
        );
    }
    let mut objects = Vec::new();
    for resource in list(&k["resources"]) {
        let path = dir.join(resource.as_str().expect("a resource path"));
        if path.is_dir() {
            objects.extend(render(&path));
        } else {
            objects.extend(documents(&path));
        }
    }
    for r in list(&k["replicas"]) {
        let name = r["name"].as_str().expect("replicas[].name");
        let count = r["count"].as_u64().expect("replicas[].count");
        let target = objects
            .iter_mut()
            .find(|o| matches!(o["kind"].as_str(), Some("Deployment" | "StatefulSet")) && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: replicas: no workload {name}", file.display()));
        target["spec"]["replicas"] = count.into();
    }
    for p in list(&k["patches"]) {
        let (kind, name) = (&p["target"]["kind"], &p["target"]["name"]);
        let path = dir.join(p["path"].as_str().expect("patches[].path"));
        let ops: Value = serde_yaml::from_str(&fs::read_to_string(&path).expect("read the patch"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let target = objects
            .iter_mut()
            .find(|o| &o["kind"] == kind && &o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name} to patch", path.display()));
        for op in list(&ops) {
            apply(target, op, &path);
        }
    }
    objects
}

/// `kubectl kustomize dir`, when kubectl is installed.
pub fn kubectl_kustomize(dir: &Path) -> Option<Vec<Value>> {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().ok()?;
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    Some(parse_documents(&String::from_utf8_lossy(&out.stdout), &dir.display().to_string()))
}

/// The objects as one multi-document YAML text, each document in JSON (a subset of YAML): a YAML
/// writer leaves strings like `no` unquoted, which YAML 1.1 readers (PyYAML, kubectl) take for
/// booleans.
pub fn to_yaml(objects: &[Value]) -> String {
    objects.iter().map(|o| serde_json::to_string_pretty(o).expect("JSON") + "\n").collect::<Vec<_>>().join("---\n")
}

fn list(v: &Value) -> Vec<&Value> {
    v.as_array().map(|a| a.iter().collect()).unwrap_or_default()
}

fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_documents(&text, &path.display().to_string())
}

fn parse_documents(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// One JSON 6902 operation (`add`, `replace`, `remove`).
fn apply(target: &mut Value, op: &Value, file: &Path) {
    let path = op["path"].as_str().expect("op.path");
    let (parent, last) = path.rsplit_once('/').expect("a JSON pointer");
    let last = last.replace("~1", "/").replace("~0", "~");
    let parent = target.pointer_mut(parent).unwrap_or_else(|| panic!("{}: no {parent} in the target", file.display()));
    match (op["op"].as_str(), parent) {
        (Some("add" | "replace"), Value::Object(map)) => {
            if op["op"] == "replace" {
                assert!(map.contains_key(&last), "{}: replace of a missing {path}", file.display());
            }
            map.insert(last, op["value"].clone());
        }
        (Some("add"), Value::Array(items)) if last == "-" => items.push(op["value"].clone()),
        (Some(kind @ ("add" | "replace")), Value::Array(items)) => {
            let i: usize = last.parse().expect("an array index");
            if kind == "add" {
                items.insert(i, op["value"].clone());
            } else {
                items[i] = op["value"].clone();
            }
        }
        (Some("remove"), Value::Object(map)) => {
            map.remove(&last).unwrap_or_else(|| panic!("{}: remove of a missing {path}", file.display()));
        }
        (Some("remove"), Value::Array(items)) => {
            items.remove(last.parse::<usize>().expect("an array index"));
        }
        (other, _) => panic!("{}: unsupported op {other:?} at {path}", file.display()),
    }
}

/// The Weir config of the rendered pod — the ConfigMap key its `-c` names — with the Secrets it
/// mounts written under `dir` as the kubelet would lay them out, and their mount paths in the
/// text pointed there: so `weir check` reads the same files the pod would.
pub fn weir_config_with_secrets(objects: &[Value], dir: &Path) -> String {
    let (pod, weir) = objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .find_map(|d| {
            let pod = &d["spec"]["template"]["spec"];
            list(&pod["containers"]).into_iter().find(|c| is_weir(c)).map(|c| (pod, c))
        })
        .expect("a Deployment with a weir container run with -c FILE");
    let args: Vec<&str> = list(&weir["args"]).into_iter().filter_map(Value::as_str).collect();
    let config = Path::new(args[args.iter().position(|a| *a == "-c").expect("-c") + 1]);
    let volume_of = |mount: &Value| {
        list(&pod["volumes"]).into_iter().find(|v| v["name"] == mount["name"]).expect("the mount's volume")
    };
    let mounts = list(&weir["volumeMounts"]);
    let config_mount = mounts
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == config.parent())
        .expect("a mount holding the config");
    let cm_name = volume_of(config_mount)["configMap"]["name"].clone();
    let cm = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == cm_name)
        .unwrap_or_else(|| panic!("no ConfigMap {cm_name}"));
    let key = config.file_name().and_then(|n| n.to_str()).expect("a file name");
    let mut text =
        cm["data"][key].as_str().unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}")).to_string();
    for mount in mounts {
        let Some(secret_name) = volume_of(mount)["secret"]["secretName"].as_str() else { continue };
        let secret = objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret_name)
            .unwrap_or_else(|| panic!("no Secret {secret_name}"));
        assert!(secret["data"].is_null(), "Secret {secret_name}: the test reads stringData only");
        let local = dir.join(secret_name);
        fs::create_dir_all(&local).expect("mkdir");
        for (file, value) in secret["stringData"].as_object().expect("stringData") {
            fs::write(local.join(file), value.as_str().expect("a string")).expect("write a secret file");
        }
        let mount_path = mount["mountPath"].as_str().expect("mountPath");
        text = text.replace(&format!("{mount_path}/"), &format!("{}/", local.display()));
    }
    text
}

/// The weir container: the weir image, run with `-c FILE` (not the `echo` stand-in app).
pub fn is_weir(container: &Value) -> bool {
    let args: Vec<&str> = list(&container["args"]).into_iter().filter_map(Value::as_str).collect();
    container["image"].as_str().is_some_and(|i| i.contains("weir")) && args.contains(&"-c") && !args.contains(&"echo")
}
