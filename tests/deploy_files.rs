//! The files in deploy/ are checked like code: the Kubernetes manifests hang together (the sidecar
//! runs weir on the mounted ConfigMap, probes and scrapes hit the admin port, the embedded config
//! passes `weir check`; the rate limit service's manifests and Istio EnvoyFilters refer to each
//! other), the Grafana dashboard only queries metrics Weir exports, with label values two running
//! instances export, the systemd unit is valid, and the Dockerfile builds the binary the README builds. Docker is not needed: the
//! image is not built here.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use regex::Regex;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `weir check -c <text written to a temp file>`: exit code 0 or the whole output.
fn weir_check(text: &str, what: &str) {
    let out = support::weir::check_config("routes.toml", text, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(0), "weir check on {what}:\n{}\n--- config ---\n{text}", out.describe());
}

// ---------------------------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------------------------

/// Every object of the Redis overlay (deploy/kubernetes/overlays/redis: N replicas on one Redis),
/// rendered like kustomize (tests/kubernetes.rs checks every overlay against the API schemas).
fn manifests() -> Vec<(String, Yaml)> {
    let objects = support::kustomize::render(&repo().join("deploy/kubernetes/overlays/redis"));
    assert!(!objects.is_empty(), "deploy/kubernetes/overlays/redis renders nothing");
    objects
        .into_iter()
        .map(|o| {
            for field in ["apiVersion", "kind"] {
                assert!(o[field].as_str().is_some_and(|s| !s.is_empty()), "an object without {field}: {o}");
            }
            assert!(o["metadata"]["name"].as_str().is_some(), "an object without metadata.name: {o}");
            ("overlays/redis".to_string(), serde_yaml::to_value(&o).expect("JSON to YAML"))
        })
        .collect()
}

fn kind<'a>(docs: &'a [(String, Yaml)], k: &str) -> Vec<&'a Yaml> {
    docs.iter().filter(|(_, d)| d["kind"] == k).map(|(_, d)| d).collect()
}

fn name(doc: &Yaml) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

fn string_map(v: &Yaml) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| {
                    let v = match v {
                        Yaml::String(s) => s.clone(),
                        Yaml::Number(n) => n.to_string(),
                        Yaml::Bool(b) => b.to_string(),
                        _ => return None,
                    };
                    Some((k.as_str()?.to_string(), v))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `selector` (a label map) selects a pod labelled `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn seq(v: &Yaml) -> Vec<&Yaml> {
    v.as_sequence().map(|s| s.iter().collect()).unwrap_or_default()
}

fn strings(v: &Yaml) -> Vec<String> {
    seq(v).into_iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

fn port_number(v: &Yaml) -> Option<u16> {
    v.as_u64().and_then(|n| u16::try_from(n).ok())
}

/// A container's port `p` (a number or a port name) as a number.
fn resolve_port(container: &Yaml, p: &Yaml) -> Option<u16> {
    if let Some(n) = port_number(p) {
        return Some(n);
    }
    let wanted = p.as_str()?;
    seq(&container["ports"])
        .into_iter()
        .find(|cp| cp["name"] == wanted)
        .and_then(|cp| port_number(&cp["containerPort"]))
}

fn container_ports(container: &Yaml) -> BTreeSet<u16> {
    seq(&container["ports"]).into_iter().filter_map(|p| port_number(&p["containerPort"])).collect()
}

fn socket_port(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("{addr:?} has no port"))
}

fn socket_host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

#[test]
fn kubernetes_manifests_hang_together() {
    let docs = manifests();
    for k in ["Deployment", "Service", "ConfigMap", "NetworkPolicy"] {
        assert!(!kind(&docs, k).is_empty(), "no {k} in deploy/kubernetes");
    }
    for d in kind(&docs, "Deployment") {
        assert_eq!(d["apiVersion"], "apps/v1", "{}", name(d));
        let selector = string_map(&d["spec"]["selector"]["matchLabels"]);
        let labels = string_map(&d["spec"]["template"]["metadata"]["labels"]);
        assert!(
            selects(&selector, &labels),
            "Deployment {}: selector {selector:?} must match its pod labels {labels:?}",
            name(d)
        );
    }

    // The Weir sidecar: a container running weir with `-c FILE`.
    let (deployment, weir, config_path) = kind(&docs, "Deployment")
        .into_iter()
        .find_map(|d| {
            seq(&d["spec"]["template"]["spec"]["containers"]).into_iter().find_map(|c| {
                let argv: Vec<String> = strings(&c["command"]).into_iter().chain(strings(&c["args"])).collect();
                let is_weir =
                    c["image"].as_str().is_some_and(|i| i.contains("weir")) && !argv.iter().any(|a| a == "echo");
                let path =
                    argv.iter().position(|a| a == "-c" || a == "--config").and_then(|i| argv.get(i + 1).cloned());
                match (is_weir, path) {
                    (true, Some(p)) => Some((d, c, p)),
                    _ => None,
                }
            })
        })
        .expect("a Deployment with a weir container run with -c FILE");
    let pod = &deployment["spec"]["template"];
    let pod_labels = string_map(&pod["metadata"]["labels"]);
    let pod_spec = &pod["spec"];

    // -c points into a directory mount of a ConfigMap (no subPath: updates must arrive).
    let config_path = Path::new(&config_path);
    let config_dir = config_path.parent().expect("config in a directory");
    let file_name = config_path.file_name().unwrap().to_string_lossy();
    let mount = seq(&weir["volumeMounts"])
        .into_iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(config_dir))
        .unwrap_or_else(|| panic!("no volumeMount at {}", config_dir.display()));
    assert!(mount["subPath"].is_null(), "a subPath mount never sees ConfigMap updates: mount the directory");
    let volume =
        seq(&pod_spec["volumes"]).into_iter().find(|v| v["name"] == mount["name"]).expect("the mounted volume");
    let cm_name = volume["configMap"]["name"].as_str().expect("the config volume is a ConfigMap");
    let cm = kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| name(c) == cm_name)
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not in deploy/kubernetes"));
    let toml_text =
        cm["data"][file_name.as_ref()].as_str().unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {file_name}"));

    // The embedded config is valid, as `weir check` says (with the Secret's files it reads).
    let secrets = tempfile::tempdir().expect("tempdir");
    let objects: Vec<Json> = docs.iter().map(|(_, d)| serde_json::to_value(d).expect("YAML to JSON")).collect();
    let checked = support::kustomize::weir_config_with_secrets(&objects, secrets.path());
    weir_check(&checked, &format!("ConfigMap {cm_name} key {file_name}"));
    let config: toml::Value = toml::from_str(toml_text).expect("TOML");
    let server = &config["server"];
    let listen: Vec<&str> =
        server["listen"].as_array().expect("server.listen").iter().map(|v| v.as_str().unwrap()).collect();
    let admin = server.get("admin").and_then(|a| a.as_str()).expect("server.admin: the probes need the admin listener");
    for addr in listen.iter().chain([&admin]) {
        assert!(
            matches!(socket_host(addr), "0.0.0.0" | "[::]"),
            "{addr}: in a pod, bind every interface (the Service, the kubelet and Prometheus use the pod IP)"
        );
    }
    let admin_port = socket_port(admin);
    let ports = container_ports(weir);
    assert!(ports.contains(&admin_port), "weir exposes the admin port {admin_port}: {ports:?}");
    for addr in &listen {
        assert!(ports.contains(&socket_port(addr)), "weir exposes {addr}: {ports:?}");
    }

    // Probes on the admin port, liveness and readiness on /healthz: readiness must not follow the
    // shared Redis, or one Redis outage takes every replica out of the Service (see
    // deployment.yaml); only start-up waits for the store (/readyz).
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/healthz"), ("startupProbe", "/readyz")] {
        let get = &weir[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} path");
        let port = resolve_port(weir, &get["port"]);
        assert_eq!(port, Some(admin_port), "{probe} hits the admin port");
    }

    // Prometheus scrapes the admin port.
    let annotations = string_map(&pod["metadata"]["annotations"]);
    assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"));
    assert_eq!(annotations.get("prometheus.io/port"), Some(&admin_port.to_string()));
    assert_eq!(annotations.get("prometheus.io/path").map(String::as_str), Some("/metrics"));

    // Weir forwards to another container of the same pod, on loopback.
    let servers: Vec<String> = config["upstream"]
        .as_array()
        .expect("[[upstream]]")
        .iter()
        .flat_map(|u| u["servers"].as_array().unwrap().clone())
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let others: Vec<&Yaml> = seq(&pod_spec["containers"]).into_iter().filter(|c| c["name"] != weir["name"]).collect();
    assert!(!others.is_empty(), "the app container runs beside weir");
    for server in &servers {
        assert!(
            matches!(socket_host(server), "127.0.0.1" | "localhost" | "[::1]"),
            "a sidecar's upstream is the app on loopback: {server}"
        );
        let port = socket_port(server);
        let served = others.iter().any(|c| {
            container_ports(c).contains(&port)
                || strings(&c["args"]).iter().chain(&strings(&c["command"])).any(|a| a.ends_with(&format!(":{port}")))
        });
        assert!(served, "no app container serves upstream {server}");
    }

    // A Service sends port 80 to Weir's listener.
    let listen_port = socket_port(listen[0]);
    let service = kind(&docs, "Service")
        .into_iter()
        .find(|s| {
            selects(&string_map(&s["spec"]["selector"]), &pod_labels)
                && seq(&s["spec"]["ports"]).iter().any(|p| p["port"] == 80)
        })
        .expect("a Service selecting the weir pods on port 80");
    let sp = seq(&service["spec"]["ports"]).into_iter().find(|p| p["port"] == 80).expect("Service port 80");
    assert_eq!(resolve_port(weir, &sp["targetPort"]), Some(listen_port), "Service port 80 targets Weir's listener");
    assert!(
        seq(&service["spec"]["ports"]).iter().all(|p| resolve_port(weir, &p["targetPort"]) != Some(admin_port)),
        "the admin port is not published by the Service"
    );

    // The store is the Redis Service of these manifests.
    assert_eq!(config["store"]["kind"].as_str(), Some("redis"));
    let url = config["store"]["url"].as_str().expect("store.url");
    let re = Regex::new(r"^rediss?://(?:[^@/]*@)?([A-Za-z0-9.-]+):(\d+)(?:/\d*)?$").unwrap();
    let caps = re.captures(url).unwrap_or_else(|| panic!("store.url {url:?} names a host and a port"));
    let (redis_host, redis_port) = (&caps[1], caps[2].parse::<u16>().unwrap());
    let redis_service = kind(&docs, "Service")
        .into_iter()
        .find(|s| redis_host.split('.').next() == Some(name(s)))
        .unwrap_or_else(|| panic!("no Service named after store.url's host {redis_host}"));
    let rsp = seq(&redis_service["spec"]["ports"])
        .into_iter()
        .find(|p| port_number(&p["port"]) == Some(redis_port))
        .unwrap_or_else(|| panic!("Service {} has no port {redis_port}", name(redis_service)));
    let redis_selector = string_map(&redis_service["spec"]["selector"]);
    let redis_container = kind(&docs, "Deployment")
        .into_iter()
        .filter(|d| selects(&redis_selector, &string_map(&d["spec"]["template"]["metadata"]["labels"])))
        .flat_map(|d| seq(&d["spec"]["template"]["spec"]["containers"]))
        .find(|c| c["image"].as_str().is_some_and(|i| i.starts_with("redis")))
        .expect("a redis Deployment behind the store Service");
    let target = resolve_port(redis_container, &rsp["targetPort"]);
    assert!(
        target.is_some_and(|p| container_ports(redis_container).contains(&p)),
        "the Redis Service reaches the redis container"
    );
    // A Redis that may evict keys with a TTL (every Weir key has one) loses limit state when full.
    let args: Vec<&str> = seq(&redis_container["args"]).iter().filter_map(|a| a.as_str()).collect();
    let policy = args.iter().position(|a| *a == "--maxmemory-policy").and_then(|i| args.get(i + 1));
    assert_eq!(policy, Some(&"noeviction"), "the limit-state Redis must not evict: args {args:?}");

    // Besides the admin token, a NetworkPolicy restricts who reaches the admin port.
    {
        let policies: Vec<&Yaml> = kind(&docs, "NetworkPolicy")
            .into_iter()
            .filter(|p| selects(&string_map(&p["spec"]["podSelector"]["matchLabels"]), &pod_labels))
            .collect();
        assert!(!policies.is_empty(), "no NetworkPolicy protects the token-less admin port");
        let rules: Vec<&Yaml> = policies.iter().flat_map(|p| seq(&p["spec"]["ingress"])).collect();
        let rule_ports = |r: &Yaml| -> Vec<Option<u16>> {
            seq(&r["ports"]).into_iter().map(|p| resolve_port(weir, &p["port"])).collect()
        };
        for r in &rules {
            let ports = rule_ports(r);
            if ports.is_empty() || ports.contains(&Some(admin_port)) {
                assert!(!seq(&r["from"]).is_empty(), "an ingress rule opens the admin port to everyone: {r:?}");
            }
        }
        assert!(
            rules.iter().any(|r| rule_ports(r).contains(&Some(admin_port))),
            "some ingress rule admits the monitoring system to the admin port"
        );
        assert!(
            rules.iter().any(|r| rule_ports(r).contains(&Some(listen_port))),
            "the NetworkPolicy still admits traffic to the proxy port"
        );
    }
}

/// deploy/kubernetes/rls, Weir as Istio's rate limit service: the core objects pass
/// `kubernetes-validate --strict` (the EnvoyFilter CRDs it cannot know are checked here instead),
/// the config passes `weir check`, the Service speaks gRPC to the container's port, and the two
/// EnvoyFilters call that Service on the config's domain with descriptors its rules match.
#[test]
fn rls_service_manifests_hang_together() {
    let objects = support::kustomize::render(&repo().join("deploy/kubernetes/rls"));
    let of_kind = |k: &str| objects.iter().filter(|o| o["kind"] == k).collect::<Vec<_>>();
    let core: Vec<&Json> = objects.iter().filter(|o| o["kind"] != "EnvoyFilter").collect();
    assert_eq!(core.len(), 4, "ConfigMap, Secret, Deployment, Service: {core:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rls.yaml");
    let yaml: Vec<String> = core.iter().map(|o| serde_yaml::to_string(o).expect("YAML")).collect();
    fs::write(&file, yaml.join("---\n")).expect("write");
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .arg(&file)
        .output()
        .expect("python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("No module named"), "kubernetes-validate is missing: run scripts/setup.sh");
    assert!(out.status.success() && !text.contains("ERROR"), "kubernetes-validate refused rls:\n{text}");

    let secrets = tempfile::tempdir().expect("tempdir");
    let config_text = support::kustomize::weir_config_with_secrets(&objects, secrets.path());
    weir_check(&config_text, "deploy/kubernetes/rls");
    let config: toml::Value = toml::from_str(&config_text).expect("TOML");
    let listen = config["rls"]["listen"][0].as_str().expect("rls.listen");
    assert_eq!(socket_host(listen), "0.0.0.0", "in a pod the service listens on every address");

    let deployment = of_kind("Deployment")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let grpc_port = container["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "grpc"))
        .and_then(|p| p["containerPort"].as_u64())
        .expect("a grpc container port");
    assert_eq!(grpc_port, u64::from(socket_port(listen)), "the container port is [rls] listen's");
    let service = of_kind("Service")[0];
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["appProtocol"], "grpc", "Istio speaks HTTP/2 to it");
    assert_eq!(port["targetPort"], "grpc");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = service["spec"]["selector"].as_object().expect("a selector");
    assert!(selector.iter().all(|(k, v)| &labels[k] == v), "the Service selects the pods");

    let filters = of_kind("EnvoyFilter");
    assert_eq!(filters.len(), 2, "the filter and the actions");
    let patch_of = |applies: &str| {
        filters
            .iter()
            .flat_map(|f| f["spec"]["configPatches"].as_array().into_iter().flatten())
            .find(|p| p["applyTo"] == applies)
            .unwrap_or_else(|| panic!("an EnvoyFilter patch applied to {applies}"))
            .clone()
    };
    let filter = patch_of("HTTP_FILTER");
    assert_eq!(filter["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(filter["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"], "envoy.filters.http.router");
    let rl = &filter["patch"]["value"];
    assert_eq!(rl["name"], "envoy.filters.http.ratelimit");
    let domain = rl["typed_config"]["domain"].as_str().expect("domain");
    let domains = config["rls"]["domain"].as_array().expect("[[rls.domain]]");
    let rules = domains
        .iter()
        .find(|d| d["name"].as_str() == Some(domain))
        .unwrap_or_else(|| panic!("the filter's domain {domain:?} is not in the config"))["descriptor"]
        .as_array()
        .expect("rules")
        .clone();
    let cluster = rl["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .expect("cluster_name");
    let service_name = service["metadata"]["name"].as_str().expect("name");
    assert!(
        cluster.starts_with(&format!("outbound|{}||{service_name}.", port["port"])),
        "{cluster} is Istio's cluster of the Service {service_name}:{}",
        port["port"]
    );
    // Each rate_limits entry's descriptor keys walk the config's rules down to a zone.
    let actions = patch_of("VIRTUAL_HOST");
    let limits = actions["patch"]["value"]["rate_limits"].as_array().expect("rate_limits");
    for limit in limits {
        let mut level = rules.clone();
        let mut zone = None;
        for action in limit["actions"].as_array().expect("actions") {
            let key = if action.get("remote_address").is_some() {
                "remote_address".to_string()
            } else {
                let m = &action["header_value_match"];
                m["descriptor_key"].as_str().unwrap_or("header_match").to_string()
            };
            let rule = level
                .iter()
                .find(|r| r["key"].as_str() == Some(key.as_str()))
                .unwrap_or_else(|| panic!("no rule for the descriptor key {key} ({limit})"))
                .clone();
            zone = rule.get("zone").cloned();
            level = rule.get("descriptor").and_then(|d| d.as_array().cloned()).unwrap_or_default();
        }
        assert!(zone.is_some(), "{limit}: its descriptor ends on a rule with a zone");
    }
}

// ---------------------------------------------------------------------------------------------
// Grafana
// ---------------------------------------------------------------------------------------------

/// Metric names (`weir_…`) registered in src/metrics/mod.rs, and which of them are histograms.
fn exported_metrics() -> (BTreeSet<String>, BTreeSet<String>) {
    let src = read("src/metrics/mod.rs");
    let names: BTreeSet<String> =
        Regex::new(r#""(weir_[a-z_]+)""#).unwrap().captures_iter(&src).map(|c| c[1].to_string()).collect();
    let histograms: BTreeSet<String> =
        Regex::new(r#"(?:histogram\(\s*&?\w+\s*,|HistogramOpts::new\()\s*"(weir_[a-z_]+)""#)
            .unwrap()
            .captures_iter(&src)
            .map(|c| c[1].to_string())
            .collect();
    assert!(
        names.len() >= 5 && !histograms.is_empty(),
        "could not read the metric names out of src/metrics/mod.rs (names {names:?}, histograms \
         {histograms:?}): update this extraction"
    );
    (names, histograms)
}

/// Label names used by src/metrics/mod.rs (`&["route", "outcome"]`).
fn exported_labels() -> BTreeSet<String> {
    let src = read("src/metrics/mod.rs");
    let quoted = Regex::new(r#""([a-z_]+)""#).unwrap();
    Regex::new(r"&\[([^\]]*)\]")
        .unwrap()
        .captures_iter(&src)
        .flat_map(|c| quoted.captures_iter(&c[1]).map(|q| q[1].to_string()).collect::<Vec<_>>())
        .collect()
}

/// Every PromQL expression of the dashboard: panel targets (rows included) and query variables.
fn promql(dashboard: &Json) -> Vec<String> {
    fn walk(v: &Json, out: &mut Vec<String>) {
        match v {
            Json::Object(m) => {
                for (k, v) in m {
                    if k == "expr" {
                        out.push(v.as_str().expect("expr is a string").to_string());
                    } else {
                        walk(v, out);
                    }
                }
            }
            Json::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] == "query" {
            let q =
                var["query"]["query"].as_str().or_else(|| var["query"].as_str()).expect("a query variable has a query");
            out.push(q.to_string());
        }
    }
    out
}

#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let text = read("deploy/grafana/weir-dashboard.json");
    let dashboard: Json = serde_json::from_str(&text).expect("the dashboard is JSON");
    for field in ["title", "uid"] {
        assert!(dashboard[field].as_str().is_some_and(|s| !s.is_empty()), "dashboard {field}");
    }
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(p["title"].as_str().is_some(), "panel without title: {p}");
        assert!(p["gridPos"]["w"].as_u64().is_some(), "panel without gridPos: {p}");
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} repeated");
        if p["type"] != "row" {
            assert!(p["targets"].as_array().is_some_and(|t| !t.is_empty()), "panel {} has no query", p["title"]);
        }
    }

    let (names, histograms) = exported_metrics();
    let mut labels = exported_labels();
    labels.insert("le".to_string());
    // Labels Prometheus adds to every scraped series.
    let target_labels = ["instance", "job", "namespace", "pod"];
    let metric_re = Regex::new(r"weir_[a-z_]+").unwrap();
    let matcher_re = Regex::new(r#"\{([^}]*)\}"#).unwrap();
    let label_re = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*""#).unwrap();
    let by_re = Regex::new(r"\b(?:by|without)\s*\(([^)]*)\)").unwrap();

    let exprs = promql(&dashboard);
    assert!(exprs.len() >= 10, "the dashboard has queries: {exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let found: Vec<&str> = metric_re.find_iter(expr).map(|m| m.as_str()).collect();
        assert!(!found.is_empty(), "a query on no weir metric: {expr}");
        for metric in found {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| metric.strip_suffix(suffix).filter(|b| histograms.contains(*b)))
                .unwrap_or(metric);
            assert!(names.contains(base), "{metric} (in {expr}) is not exported by src/metrics/mod.rs: {names:?}");
            if histograms.contains(base) {
                assert_ne!(base, metric, "{metric} is a histogram: query its _bucket, _sum or _count ({expr})");
            }
            used.insert(base.to_string());
        }
        for set in matcher_re.captures_iter(expr) {
            for l in label_re.captures_iter(&set[1]) {
                assert!(
                    labels.contains(&l[1]) || target_labels.contains(&&l[1]),
                    "label {} (in {expr}) is on no weir metric: {labels:?}",
                    &l[1]
                );
            }
        }
        for grouping in by_re.captures_iter(expr) {
            for l in grouping[1].split(',').map(str::trim).filter(|l| !l.is_empty()) {
                assert!(
                    labels.contains(l) || target_labels.contains(&l),
                    "grouping label {l} (in {expr}) is on no weir metric: {labels:?}"
                );
            }
        }
    }
    // The panels the dashboard exists for.
    for core in [
        "weir_requests_total",
        "weir_limit_req_delay_seconds",
        "weir_store_request_duration_seconds",
        "weir_store_errors_total",
        "weir_upstream_responses_total",
        "weir_upstream_response_duration_seconds",
        "weir_config_generation",
        "weir_config_reload_failures_total",
        "weir_rls_requests_total",
        "weir_rls_request_duration_seconds",
        "weir_upstream_server_up",
    ] {
        assert!(used.contains(core), "the dashboard shows {core}");
    }
    // A metric added later is not an error here, but worth a panel.
    let unused: Vec<&String> = names.difference(&used).collect();
    if !unused.is_empty() {
        println!("note: exported but on no dashboard panel: {unused:?}");
    }
}

/// Every literal label value the dashboard matches (`outcome="rejected"`, `outcome=~"a|b"`), as
/// (metric, label, value); `$variables` and regular expressions other than plain alternatives are
/// left out.
fn matched_label_values(exprs: &[String]) -> BTreeSet<(String, String, String)> {
    let selector = Regex::new(r"(weir_[a-z_]+)\{([^}]*)\}").unwrap();
    let matcher = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|=)\s*"([^"]*)""#).unwrap();
    let word = Regex::new(r"^[a-zA-Z0-9_]+$").unwrap();
    let mut out = BTreeSet::new();
    for expr in exprs {
        for sel in selector.captures_iter(expr) {
            for m in matcher.captures_iter(&sel[2]) {
                let values: Vec<&str> = if &m[2] == "=" { vec![&m[3]] } else { m[3].split('|').collect() };
                if values.iter().all(|v| word.is_match(v)) {
                    for v in values {
                        out.insert((sel[1].to_string(), m[1].to_string(), v.to_string()));
                    }
                }
            }
        }
    }
    out
}

/// A proxy route and an RLS domain whose calls give every outcome the dashboard names: with a
/// working store (`passed`, `rejected`, `rejected_dry_run`, `bad_request`) or a
/// dead one (`fail_open`, `fail_closed`, for both front doors).
fn exercised_weir(store: &str) -> support::weir::Weir {
    let up = support::upstream::Upstream::start();
    let config = support::config::with_app(
        support::admin::LISTEN,
        &format!("{store}\n\n[log]\naccess_log = false"),
        up.addr(),
        r#"
[[limit_req_zone]]
name = "tight"
key = "ip"
rate = "1r/m"

[[route]]
name = "open"
path_prefix = "/open/"
upstream = "app"
on_error = "allow"
limit_req = [{ zone = "tight" }]

[[limit_req_zone]]
name = "loose"
key = "ip"
rate = "1000r/s"

[[route]]
name = "closed"
path_prefix = "/closed/"
upstream = "app"
on_error = "deny"
limit_req = [{ zone = "tight", dry_run = true }, { zone = "loose" }]

[rls]
listen = ["$LISTEN3"]
"#,
    );
    // The RLS listener on a port of its own (the helper substitutes $LISTEN and $LISTEN2 only).
    let rls_port = support::weir::free_port();
    let config = config.replace("$LISTEN3", &format!("127.0.0.1:{rls_port}"))
        + "\n[[rls.domain]]\nname = \"open\"\non_error = \"allow\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"tight\"\n\n\
           [[rls.domain]]\nname = \"closed\"\non_error = \"deny\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"tight\"\n";
    let weir = support::weir::Weir::start(&config);
    for path in ["/open/a", "/open/a", "/closed/a", "/closed/a"] {
        let _ = support::http::must_send(weir.addr, &support::http::Request::get(path));
    }
    let rls: std::net::SocketAddr = format!("127.0.0.1:{rls_port}").parse().expect("address");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        use weir::rls::proto::rate_limit_descriptor::Entry;
        use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
        let channel = support::poll::poll(
            Duration::from_secs(10),
            Duration::from_millis(50),
            || std::net::TcpStream::connect(rls).is_ok(),
            |up| *up,
        );
        assert!(channel.is_ok(), "the rls listener {rls} accepts");
        let channel = tonic::transport::Channel::from_shared(format!("http://{rls}"))
            .expect("uri")
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let mut client = RateLimitServiceClient::new(channel);
        let call = |domain: &str, descriptors: usize| RateLimitRequest {
            domain: domain.into(),
            descriptors: (0..descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry { key: "k".into(), value: "v".into() }],
                    limit: None,
                    hits_addend: None,
                })
                .collect(),
            hits_addend: 0,
        };
        for (domain, n) in [("open", 1), ("open", 1), ("closed", 1), ("open", 0)] {
            let _ = client.should_rate_limit(call(domain, n)).await;
        }
    });
    weir
}

/// The dashboard's label values are ones a running Weir exports: the outcomes it matches come
/// out of two real instances (a working store and a dead one) driven through both front doors.
#[test]
fn grafana_label_values_are_ones_a_running_weir_exports() {
    let dashboard: Json = serde_json::from_str(&read("deploy/grafana/weir-dashboard.json")).expect("JSON");
    let wanted = matched_label_values(&promql(&dashboard));
    assert!(wanted.iter().any(|(_, l, _)| l == "outcome"), "the dashboard matches outcomes: {wanted:?}");

    let (_refusing, dead) = support::weir::refusing_addr();
    let working = exercised_weir(support::config::MEMORY_STORE);
    let failing = exercised_weir(&support::config::redis_store(
        &format!("redis://{dead}"),
        "timeout = \"200ms\"\non_error = \"allow\"",
    ));
    let mut exported: BTreeSet<(String, String, String)> = BTreeSet::new();
    for weir in [&working, &failing] {
        let admin = support::admin::addr(weir);
        // Metrics are recorded after the answers: wait for the last call's (invalid) to show.
        let scrape = support::metrics::scrape_until(admin, Duration::from_secs(10), Duration::from_millis(50), |s| {
            s.sum("weir_rls_requests_total", &[("outcome", "bad_request")]) >= 1.0
        })
        .unwrap_or_else(|s| panic!("no invalid call counted:\n{}", s.filtered()));
        for metric in wanted.iter().map(|(m, _, _)| m).collect::<BTreeSet<_>>() {
            for labels in scrape.series(metric).keys() {
                for (l, v) in labels {
                    exported.insert((metric.clone(), l.clone(), v.clone()));
                }
            }
        }
    }
    let missing: Vec<_> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard matches label values no running Weir exported: {missing:?}\n(exported: {exported:?})"
    );
}

// ---------------------------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------------------------

/// Runs `systemd-analyze verify` on `unit` (written as weir.service in a temp dir): its complaints,
/// or None when the command is not installed.
fn systemd_verify(unit: &str) -> Option<(bool, String)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.service");
    fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().ok()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // Complaints about the unit name the file; anything else (no systemd running, …) is noise.
    let complaints: Vec<&str> = text.lines().filter(|l| l.contains("weir.service")).collect();
    Some((out.status.success(), complaints.join("\n")))
}

#[test]
fn systemd_unit_is_valid() {
    let unit = read("deploy/weir.service");
    assert!(unit.lines().any(|l| l.trim() == "ExecReload=/bin/kill -HUP $MAINPID"), "reload is SIGHUP");
    let exec_start = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let argv: Vec<&str> = exec_start.split_whitespace().collect();
    assert!(argv[0].ends_with("/weir"), "ExecStart runs weir: {exec_start}");
    let config_path = argv.windows(2).find(|w| w[0] == "-c").map(|w| w[1]).expect("ExecStart passes -c FILE");
    assert!(unit.contains(&format!("weir check -c {config_path}")), "ExecStartPre checks the same file ExecStart runs");
    for hardening in
        ["NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "DynamicUser=yes"]
            .into_iter()
            .chain(HARDENING)
    {
        assert!(unit.lines().any(|l| l.trim() == hardening), "unit keeps {hardening}");
    }
    let memory_max = unit.lines().find_map(|l| l.strip_prefix("MemoryMax=")).expect("MemoryMax= bounds the service");
    assert!(memory_max.ends_with(['M', 'G']) && memory_max != "infinity", "MemoryMax={memory_max}");

    // The binary is not installed here: point the Exec lines at /bin/true.
    let binary = argv[0];
    let testable = unit.replace(binary, "/bin/true");
    let Some((ok, complaints)) = systemd_verify(&testable) else {
        println!("note: systemd-analyze is not installed; deploy/weir.service was not verified");
        return;
    };
    // Make sure this systemd-analyze reports problems at all before trusting its silence.
    let broken = testable.replace("Restart=on-failure", "Restart=sometimes\nNoSuchKey=1");
    let (_, noticed) = systemd_verify(&broken).unwrap();
    if noticed.is_empty() {
        println!("note: systemd-analyze verify reports nothing here; deploy/weir.service was not verified");
        return;
    }
    assert!(
        ok && complaints.is_empty(),
        "systemd-analyze verify deploy/weir.service (Exec paths → /bin/true):\n{complaints}"
    );
    match systemd_exposure(&testable) {
        None => println!("note: this systemd-analyze has no `security --offline`; the exposure was not scored"),
        // 3.4 before issue 46's hardening (no system call filter, UMask, ProtectProc, PrivateMounts).
        Some(score) => {
            assert!(score <= 2.0, "systemd-analyze security scores deploy/weir.service {score} (want ≤ 2.0)")
        }
    }
}

/// Hardening the unit keeps beyond the basics (issue 46); the Debian package's unit is made from
/// it and is checked for the same in tests/install.rs.
const HARDENING: [&str; 7] = [
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged",
    "SystemCallErrorNumber=EPERM",
    "ProtectProc=invisible",
    "PrivateMounts=yes",
    "UMask=0077",
    "SystemCallArchitectures=native",
];

/// `systemd-analyze security --offline=yes` of `unit`: its overall exposure (0 safest, 10 worst),
/// or None where the command or its offline mode (systemd ≥ 250) is missing.
fn systemd_exposure(unit: &str) -> Option<f64> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.service");
    fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze").args(["security", "--offline=yes"]).arg(&path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("Overall exposure level"))?;
    line.split(':').nth(1)?.split_whitespace().next()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Dockerfile
// ---------------------------------------------------------------------------------------------

/// One Dockerfile instruction: keyword (upper case) and its arguments, continuations joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile() -> Vec<Instruction> {
    let text = read("deploy/Dockerfile");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let full = std::mem::take(&mut current);
        let (keyword, args) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
        out.push(Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    assert!(current.is_empty(), "Dockerfile ends inside a continuation");
    out
}

/// Splits the instructions into stages, each starting at its FROM.
fn stages(instructions: &[Instruction]) -> Vec<&[Instruction]> {
    let starts: Vec<usize> =
        instructions.iter().enumerate().filter(|(_, i)| i.keyword == "FROM").map(|(n, _)| n).collect();
    assert_eq!(starts.first(), Some(&0), "the Dockerfile starts with FROM");
    starts
        .iter()
        .enumerate()
        .map(|(k, &s)| &instructions[s..*starts.get(k + 1).unwrap_or(&instructions.len())])
        .collect()
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn dockerfile_builds_the_binary_the_readme_builds() {
    let instructions = dockerfile();
    let stages = stages(&instructions);
    assert!(stages.len() >= 2, "a multi-stage build");
    let (builder, runtime) = (stages[0], stages[stages.len() - 1]);
    // A pinned toolchain (rust:1.NN), so the same sources build the same binary.
    assert!(
        Regex::new(r"^rust:1\.\d+-bookworm AS builder$").unwrap().is_match(&builder[0].args),
        "builder image {:?}: pin rust:1.NN-bookworm",
        builder[0].args
    );
    assert_eq!(runtime[0].args, "debian:bookworm-slim");
    let runs = |stage: &[Instruction]| -> Vec<String> {
        stage.iter().filter(|i| i.keyword == "RUN").map(|i| i.args.clone()).collect()
    };

    // The build command is the quick start's (README → scripts/run.sh).
    const BUILD: &str = "cargo build --release --locked --bin weir";
    assert!(runs(builder).iter().any(|r| r.contains(BUILD)), "the builder runs `{BUILD}`");
    assert!(
        runs(builder).iter().any(|r| r.contains("apt-get install") && r.contains("cmake")),
        "the builder installs cmake (Pingora's zlib-ng)"
    );
    assert!(read("README.md").contains("scripts/run.sh"));
    assert!(
        read("scripts/run.sh").contains(BUILD),
        "scripts/run.sh (the README's quick start) builds with `{BUILD}` too"
    );
    let cargo: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    assert!(
        cargo["bin"].as_array().is_some_and(|b| b.iter().any(|b| b["name"].as_str() == Some("weir"))),
        "Cargo.toml declares the weir binary"
    );

    // The build context copies everything the build reads.
    let workdir =
        builder.iter().rfind(|i| i.keyword == "WORKDIR").map(|i| i.args.clone()).expect("the builder sets WORKDIR");
    let copied: Vec<PathBuf> = builder
        .iter()
        .filter(|i| i.keyword == "COPY" && !i.args.starts_with("--from"))
        .flat_map(|i| {
            let words: Vec<&str> = i.args.split(' ').collect();
            words[..words.len() - 1].iter().map(|w| PathBuf::from(w.trim_end_matches('/'))).collect::<Vec<_>>()
        })
        .collect();
    for p in &copied {
        assert!(repo().join(p).exists(), "COPY source {} does not exist", p.display());
    }
    let covered = |p: &Path| copied.iter().any(|c| p.starts_with(c));
    for needed in ["Cargo.toml", "Cargo.lock", "src/main.rs"] {
        assert!(covered(Path::new(needed)), "the build needs {needed}");
    }
    if repo().join("build.rs").exists() {
        assert!(covered(Path::new("build.rs")), "the build needs build.rs");
    }
    // Explicit cargo targets must exist in the image's context, or cargo refuses the manifest.
    for section in ["bin", "bench", "example", "test"] {
        for target in cargo.get(section).and_then(|t| t.as_array()).into_iter().flatten() {
            if let Some(p) = target.get("path").and_then(|p| p.as_str()) {
                assert!(covered(Path::new(p)), "Cargo.toml [[{section}]] path {p} is not copied");
            }
        }
    }
    // Files compiled in with include_str!/include_bytes!.
    let include = Regex::new(r#"include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)"#).unwrap();
    let mut pending = vec![repo().join("src")];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap();
                for c in include.captures_iter(&text) {
                    let target = normalize(&path.parent().unwrap().join(&c[1]));
                    let rel = target.strip_prefix(repo()).unwrap().to_path_buf();
                    assert!(
                        covered(&rel),
                        "{} includes {}, which the Dockerfile does not copy",
                        path.display(),
                        rel.display()
                    );
                }
            }
        }
    }

    // The runtime stage takes the binary the builder built.
    let from_builder: Vec<&Instruction> =
        runtime.iter().filter(|i| i.keyword == "COPY" && i.args.starts_with("--from=builder")).collect();
    let binary = from_builder
        .iter()
        .find_map(|i| {
            let words: Vec<&str> = i.args.split(' ').collect();
            (words.len() == 3).then(|| (words[1], words[2]))
        })
        .expect("COPY --from=builder SRC DEST");
    let built = format!("{}/target/release/weir", workdir.trim_end_matches('/'));
    assert_eq!(binary.0, built, "the image gets the builder's target/release/weir");
    assert_eq!(binary.1, "/usr/local/bin/weir", "weir is on PATH");
    assert!(
        runtime.iter().any(|i| i.keyword == "COPY" && i.args == "conf/routes.toml /etc/weir/routes.toml"),
        "conf/routes.toml is the image's default config"
    );
    let user = runtime.iter().rfind(|i| i.keyword == "USER").map(|i| i.args.clone()).expect("USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as a non-root user, not {user}");
    let expose: BTreeSet<&str> =
        runtime.iter().filter(|i| i.keyword == "EXPOSE").flat_map(|i| i.args.split(' ')).collect();
    assert_eq!(expose, BTreeSet::from(["8080", "9901"]));
    let json_form = |keyword: &str| -> Vec<String> {
        let i = runtime.iter().rfind(|i| i.keyword == keyword).unwrap_or_else(|| panic!("no {keyword}"));
        serde_json::from_str(&i.args).unwrap_or_else(|e| panic!("{keyword} in JSON (exec) form ({e}): {}", i.args))
    };
    assert_eq!(json_form("ENTRYPOINT"), ["weir"]);
    assert_eq!(json_form("CMD"), ["-c", "/etc/weir/routes.toml"]);

    // The image rewrites the listener to 0.0.0.0 (a container's loopback is unreachable) and
    // checks the result at build time: the same edit on conf/routes.toml must pass `weir check`.
    let sed = runs(runtime)
        .into_iter()
        .find(|r| r.contains("sed -i") && r.contains("/etc/weir/routes.toml"))
        .expect("the runtime stage rewrites listen in /etc/weir/routes.toml");
    assert!(
        sed.contains("weir check -c /etc/weir/routes.toml"),
        "the build runs weir check on the image's config: {sed}"
    );
    let conf = read("conf/routes.toml");
    let loopback = "listen = [\"127.0.0.1:8080\"]";
    assert!(
        conf.lines().any(|l| l.starts_with(loopback)),
        "conf/routes.toml has the line the Dockerfile rewrites: {loopback}"
    );
    let in_image = conf.replacen(loopback, "listen = [\"0.0.0.0:8080\"]", 1);
    weir_check(&in_image, "the image's /etc/weir/routes.toml");
}
