//! deploy/kubernetes, validated offline: each overlay (memory, redis, sentinel) is rendered — by
//! kubectl's kustomize where kubectl exists, and always by tests/support/kustomize.rs, which must
//! agree with it — then checked against the Kubernetes API schemas with `kubernetes-validate
//! --strict` (PyPI; scripts/setup.sh installs it), its Weir config passes `weir check` with the
//! Secret's files, and the pieces refer to each other correctly (probes, PDB, ServiceMonitor,
//! replicas and store per overlay). The ConfigMap and Secret symlink-swap reloads are tested with
//! the real binary in tests/reload.rs (kubernetes_configmap_symlink_swap_is_picked_up) and
//! tests/secrets.rs.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::kustomize;

const OVERLAYS: [&str; 3] = ["memory", "redis", "sentinel"];

fn overlay_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/overlays").join(name)
}

fn sorted(mut objects: Vec<Value>) -> Vec<Value> {
    objects.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

/// `kubernetes-validate --strict` over the rendered YAML: exit 0, no error line.
fn kubernetes_validate(yaml: &str, what: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(format!("{what}.yaml"));
    std::fs::write(&file, yaml).expect("write");
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .arg(&file)
        .output()
        .expect("python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !text.contains("No module named kubernetes_validate"),
        "kubernetes-validate is missing: run scripts/setup.sh (pip install kubernetes-validate)"
    );
    assert!(out.status.success() && !text.contains("ERROR"), "{what}: kubernetes-validate refused it:\n{text}");
}

#[test]
fn overlays_render_validate_and_hang_together() {
    for overlay in OVERLAYS {
        let dir = overlay_dir(overlay);
        let objects = sorted(kustomize::render(&dir));
        match kustomize::kubectl_kustomize(&dir) {
            Some(theirs) => assert_eq!(sorted(theirs), objects, "{overlay}: kubectl kustomize renders otherwise"),
            None => eprintln!("{overlay}: kubectl not installed: rendered by tests/support/kustomize.rs alone"),
        }
        kubernetes_validate(&kustomize::to_yaml(&objects), overlay);

        // The embedded config, with the Secret's files where the pod has them.
        let secrets = tempfile::tempdir().expect("tempdir");
        let text = kustomize::weir_config_with_secrets(&objects, secrets.path());
        let config_file = secrets.path().join("routes.toml");
        std::fs::write(&config_file, &text).expect("write");
        let out =
            support::weir::run(["check".as_ref(), "-c".as_ref(), config_file.as_os_str()], Duration::from_secs(30));
        assert_eq!(out.code, Some(0), "{overlay}: weir check:\n{}", out.describe());
        assert!(out.stdout.contains("server.admin_token: from file"), "{overlay}: {}", out.stdout);
        let config: toml::Value = toml::from_str(&text).expect("TOML");

        let api = find(&objects, "Deployment", "api");
        let pod = &api["spec"]["template"];
        let weir = pod["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| kustomize::is_weir(c)))
            .expect("the weir container");
        let store = config["store"]["kind"].as_str().expect("store.kind");
        let url = config["store"].get("url").and_then(|u| u.as_str()).unwrap_or("");
        let (replicas, kind, scheme) = match overlay {
            "memory" => (1, "memory", ""),
            "redis" => (3, "redis", "redis://weir-redis:"),
            _ => (3, "redis", "redis+sentinel://"),
        };
        assert_eq!(api["spec"]["replicas"], replicas, "{overlay}: replicas");
        assert_eq!(store, kind, "{overlay}: store");
        assert!(url.starts_with(scheme), "{overlay}: store.url {url}");
        if kind == "redis" {
            assert_eq!(config["store"]["fleet_size"].as_integer(), Some(replicas), "{overlay}: fleet_size = replicas");
            let pw = config["store"]["password_file"].as_str().expect("the Redis password from the Secret");
            assert!(pw.starts_with(&secrets.path().display().to_string()), "{overlay}: {pw}");
        }

        // Probes on the admin port: start-up on /readyz (the store decides), then /healthz.
        let admin_port: u64 = config["server"]["admin"]
            .as_str()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .expect("admin");
        let named_admin = weir["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["containerPort"] == admin_port))
            .and_then(|p| p["name"].as_str())
            .expect("a named container port for the admin listener");
        for (probe, path) in
            [("startupProbe", "/readyz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/healthz")]
        {
            assert_eq!(weir[probe]["httpGet"]["path"], path, "{overlay}: {probe}");
            assert_eq!(weir[probe]["httpGet"]["port"], named_admin, "{overlay}: {probe} port");
        }
        for c in pod["spec"]["containers"].as_array().expect("containers") {
            for r in ["cpu", "memory"] {
                assert!(c["resources"]["requests"][r].is_string(), "{overlay}: {} requests no {r}", c["name"]);
            }
            assert!(c["resources"]["limits"]["memory"].is_string(), "{overlay}: {} has no memory limit", c["name"]);
        }

        // The PodDisruptionBudget covers the api pods.
        let pdb = find(&objects, "PodDisruptionBudget", "api");
        assert!(selects(&pdb["spec"]["selector"]["matchLabels"], &pod["metadata"]["labels"]), "{overlay}: PDB");

        // The ServiceMonitor scrapes the admin port through a Service selecting the api pods,
        // with the token the config reads.
        let monitor = objects.iter().find(|o| o["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
        let service = objects
            .iter()
            .filter(|o| o["kind"] == "Service")
            .find(|s| selects(&monitor["spec"]["selector"]["matchLabels"], &s["metadata"]["labels"]))
            .expect("the ServiceMonitor's Service");
        assert!(selects(&service["spec"]["selector"], &pod["metadata"]["labels"]), "{overlay}: selects the pods");
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["path"], "/metrics");
        let port = service["spec"]["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == endpoint["port"]))
            .expect("the ServiceMonitor's port in its Service");
        assert_eq!(port["targetPort"], named_admin, "{overlay}: the ServiceMonitor scrapes the admin port");
        let token_key = endpoint["bearerTokenSecret"]["key"].as_str().expect("bearerTokenSecret.key");
        let token_file = config["server"]["admin_token_file"].as_str().expect("admin_token_file");
        let secret_name = endpoint["bearerTokenSecret"]["name"].as_str().expect("bearerTokenSecret.name");
        assert_eq!(
            Path::new(token_file),
            secrets.path().join(secret_name).join(token_key),
            "{overlay}: Prometheus sends the token Weir reads"
        );
    }
}
