//! `weir import-ingress` on the manifests of tests/data/ingress/: each imports (every backend
//! sent to a test address) and passes `weir check`; a raw-nginx snippet is refused at its line;
//! `--replicas` reports the per-replica totals; and a differential: for each accepted manifest,
//! real nginx runs the config ingress-nginx would have generated for it (the test oracle
//! `ingress_nginx_conf`, read from the controller's source) and Weir runs the import, against
//! the same upstream, on the seeded schedule of tests/support/nginx_differential.rs.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::nginx_differential::{compare, Case, Fwd, NginxConf, Tally, PLAIN};
use support::upstream::Upstream;
use support::weir::{self, Weir};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ingress")
}

fn import(args: &[&str]) -> weir::RunOutput {
    let mut all = vec!["import-ingress", "--upstream", "127.0.0.1:9000", "--listen", "127.0.0.1:8080"];
    all.extend_from_slice(args);
    weir::run(all, Duration::from_secs(30))
}

#[test]
fn every_manifest_imports_and_passes_weir_check() {
    let mut seen = 0;
    for entry in std::fs::read_dir(corpus()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        seen += 1;
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let p = path.display().to_string();
        let out = import(&[&p]);
        assert!(out.code == Some(0), "{name}: {}", out.describe());
        let dir = weir::ConfigDir::new();
        let file = dir.write("imported.toml", &out.stdout);
        let check = weir::run(["check", "-c", &file.display().to_string()], Duration::from_secs(30));
        assert!(check.code == Some(0), "{name}: {}\n{}", check.describe(), out.stdout);
    }
    assert!(seen >= 9, "the corpus has {seen} manifests");
    // A directory is read whole (its refused/ subdirectory too: refused without the flag).
    let dir = corpus().display().to_string();
    let out = import(&[&dir]);
    assert!(out.code != Some(0) && out.stderr.contains("server-snippet"), "{}", out.describe());
    let out = import(&[&dir, "--allow-unexpressed"]);
    assert!(out.code == Some(0), "{}", out.describe());
    assert!(out.stderr.contains("left out:") && out.stderr.contains("server-snippet"), "{}", out.stderr);
}

#[test]
fn annotations_translate_as_ingress_nginx_generated_them() {
    let p = corpus().join("annotations-doc.yaml").display().to_string();
    let out = import(&[&p, "--replicas", "3"]);
    assert!(out.code == Some(0), "{}", out.describe());
    let t = &out.stdout;
    assert!(t.contains("limit_req_status = 429"), "{t}");
    assert!(t.contains("{ zone = \"storefront-production_checkout-api_7d0b3c6e-2f41-4a8e-b9d2-5c3e8f1a0b27_rps\", burst = 10, nodelay = true, unless = "), "{t}");
    assert!(t.contains("burst = 200, nodelay = true"), "{t}");
    assert!(t.contains("unless = [ { ip = [\"10.1.0.0/16\", \"192.168.0.0/24\"] } ]"), "{t}");
    assert!(t.contains("trusted = [\"10.0.0.0/8\"]"), "{t}");
    assert!(t.contains("path_regex = \"(?i)^/api/checkout\""), "{t}");
    assert!(out.stderr.contains("limit-rps 5: across 3 replicas effectively 15 r/s"), "{}", out.stderr);
}

#[test]
fn every_annotation_of_one_ingress_applies_and_the_whitelist_exempts_from_all_of_them() {
    let p = corpus().join("limits-every-annotation.yaml").display().to_string();
    let out = import(&[&p]);
    assert!(out.code == Some(0), "{}", out.describe());
    let t = &out.stdout;
    let exempt = "unless = [ { ip = [\"10.0.0.0/8\", \"172.16.0.0/12\"] } ]";
    // limit-rps and limit-rpm both apply, burst = rate × limit-burst-multiplier, always nodelay.
    assert!(t.contains(&format!("_rps\", burst = 15, nodelay = true, {exempt} }}")), "{t}");
    assert!(t.contains(&format!("_rpm\", burst = 300, nodelay = true, {exempt} }}")), "{t}");
    // limit-connections, exempted by the same whitelist (ingress-nginx keys both by one map).
    assert!(t.contains(&format!("_conn\", max = 10, {exempt} }}]\nlimit_conn_status = 503")), "{t}");
    assert!(t.contains("limit_rate = \"512k\"\nlimit_rate_after = \"1024k\""), "{t}");
    // limit-allowlist (the newer spelling) and the default multiplier 5.
    assert!(t.contains("burst = 150, nodelay = true, unless = [ { ip = [\"192.0.2.0/24\"] } ]"), "{t}");
    // The Ingress without annotations has no limit on the same host.
    let docs = &t[t.find("Ingress api_docs path /").unwrap()..];
    let docs = &docs[..docs.find("\n\n").unwrap()];
    assert!(!docs.contains("limit_req"), "{docs}");
}

#[test]
fn refused_manifests_name_their_file_line_and_reason() {
    let dir = corpus().join("refused");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let want = text.lines().find_map(|l| l.strip_prefix("# refused: ")).expect("a `# refused:` line");
        let (line, words) = want.split_once(": ").unwrap();
        let p = path.display().to_string();
        let out = import(&[&p]);
        assert!(out.code != Some(0), "{p} was imported:\n{}", out.stdout);
        let expect = format!("{p}:{line}: ");
        assert!(
            out.stderr.contains(&expect) && out.stderr.contains(words),
            "{p}: want {expect}…{words}, got {}",
            out.stderr
        );
        seen += 1;
    }
    assert!(seen >= 2, "{seen} refused manifests");
}

#[test]
fn snippets_are_refused_with_file_and_line() {
    let p = corpus().join("refused/server-snippet.yaml").display().to_string();
    let out = import(&[&p]);
    assert!(out.code != Some(0), "{}", out.stdout);
    assert!(
        out.stderr.contains(&format!("{p}:6: Ingress default/stats: nginx.ingress.kubernetes.io/server-snippet")),
        "{}",
        out.stderr
    );
}

/// The test oracle: the nginx config ingress-nginx generated for these manifests, as far as
/// their limits and routing go — read from kubernetes/ingress-nginx (commit dbb11b92):
/// internal/ingress/annotations/ratelimit/main.go (zones `<ns>_<name>_<uid>_{rps,rpm,conn}`,
/// burst = limit × limit-burst-multiplier (default 5), the allow-list, limit-rate and
/// limit-rate-after falling back to the ConfigMap's), internal/ingress/controller/template/
/// template.go (buildRateLimitZones, buildRateLimit: `limit_conn`, then `limit_req … nodelay`
/// for rps and rpm, `limit_rate_after Nk`, `limit_rate Nk`; buildLocation; enforceRegexModifier),
/// rootfs/etc/nginx/template/nginx.tmpl (the `geo $remote_addr $allowlist_<id>` and `map …
/// $limit_<id>` per limit, `limit_req_status`/`limit_conn_status` from the ConfigMap, realip
/// for use-forwarded-headers), internal/ingress/controller/controller.go (each host's root
/// location is the default backend carrying the annotations of the host's first Ingress until a
/// path `/` replaces it; the first Ingress of a path wins; locations sorted by length) and
/// location.go (a Prefix path gets `location /p/` and an exact `location = /p`, unless it is a
/// regex or rewritten). The controller is retired and not installable here; this is what its
/// template printed, for a real nginx to run. The default backend is a server of the same nginx
/// on a unix socket answering 404.
fn ingress_nginx_conf(manifests: &str, upstream: &str, default_backend: &str) -> String {
    use serde::Deserialize;
    use serde_yaml::Value;
    use std::collections::BTreeMap;

    #[derive(Clone, Default)]
    struct RateLimit {
        id: String,
        name: String,
        rps: i64,
        rpm: i64,
        conn: i64,
        mult: i64,
        allow: Vec<String>,
        rate: i64,
        rate_after: i64,
    }
    #[derive(Clone)]
    struct Loc {
        path: String,
        exact: bool,
        prefix: bool,
        rl: RateLimit,
        regex: bool,
        rewrite: bool,
        default_backend: bool,
    }
    let docs: Vec<Value> =
        serde_yaml::Deserializer::from_str(manifests).filter_map(|d| Value::deserialize(d).ok()).collect();
    let s = |v: &Value, path: &[&str]| -> Option<String> {
        let mut v = v;
        for p in path {
            v = v.get(p)?;
        }
        v.as_str().map(str::to_string).or_else(|| v.as_i64().map(|n| n.to_string()))
    };
    let mut cm: BTreeMap<String, String> = BTreeMap::new();
    for d in docs.iter().filter(|d| s(d, &["kind"]).as_deref() == Some("ConfigMap")) {
        for (k, v) in d.get("data").and_then(Value::as_mapping).into_iter().flatten() {
            if let (Some(k), Some(v)) = (k.as_str(), v.as_str()) {
                cm.insert(k.into(), v.into());
            }
        }
    }
    let cm_int = |k: &str| cm.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    // The default server's root: the default backend, no annotations (an Ingress without a
    // host may replace it with its path `/`).
    let root = Loc {
        path: "/".into(),
        exact: false,
        prefix: true,
        rl: RateLimit::default(),
        regex: false,
        rewrite: false,
        default_backend: true,
    };
    let mut servers: Vec<(String, Vec<Loc>)> = vec![("_".into(), vec![root])];
    let mut limits: Vec<RateLimit> = Vec::new();
    for d in docs.iter().filter(|d| s(d, &["kind"]).as_deref() == Some("Ingress")) {
        let ns = s(d, &["metadata", "namespace"]).unwrap_or_else(|| "default".into());
        let name = s(d, &["metadata", "name"]).unwrap_or_default();
        let uid = s(d, &["metadata", "uid"]).unwrap_or_default();
        let ann = |k: &str| s(d, &["metadata", "annotations", &format!("nginx.ingress.kubernetes.io/{k}")]);
        let int = |k: &str| ann(k).and_then(|v| v.trim().parse::<i64>().ok());
        let mut rl = RateLimit {
            rps: int("limit-rps").unwrap_or(0),
            rpm: int("limit-rpm").unwrap_or(0),
            conn: int("limit-connections").unwrap_or(0),
            mult: int("limit-burst-multiplier").unwrap_or(5),
            rate: int("limit-rate").unwrap_or_else(|| cm_int("limit-rate")),
            rate_after: int("limit-rate-after").unwrap_or_else(|| cm_int("limit-rate-after")),
            ..RateLimit::default()
        };
        if rl.rps != 0 || rl.rpm != 0 || rl.conn != 0 {
            rl.name = format!("{ns}_{name}_{uid}");
            rl.id = base64_url(&rl.name);
            let list = ann("limit-allowlist").or_else(|| ann("limit-whitelist")).unwrap_or_default();
            rl.allow = list.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect();
            limits.push(rl.clone());
        }
        let regex = ann("use-regex").as_deref() == Some("true");
        let target = ann("rewrite-target");
        for rule in d.get("spec").and_then(|s| s.get("rules")).and_then(Value::as_sequence).into_iter().flatten() {
            let host = s(rule, &["host"]).unwrap_or_else(|| "_".into());
            let at = match servers.iter().position(|(h, _)| *h == host) {
                Some(i) => i,
                None => {
                    // A new host's root location: the default backend, with this Ingress's annotations.
                    let root = Loc {
                        path: "/".into(),
                        exact: false,
                        prefix: true,
                        rl: rl.clone(),
                        regex: false,
                        rewrite: false,
                        default_backend: true,
                    };
                    servers.push((host.clone(), vec![root]));
                    servers.len() - 1
                }
            };
            let paths = rule.get("http").and_then(|h| h.get("paths")).and_then(Value::as_sequence);
            for p in paths.into_iter().flatten() {
                let path = s(p, &["path"]).unwrap_or_else(|| "/".into());
                let kind = s(p, &["pathType"]).unwrap_or_else(|| "Prefix".into());
                let loc = Loc {
                    rewrite: target.as_ref().is_some_and(|t| !t.is_empty() && *t != path),
                    path,
                    exact: kind == "Exact",
                    prefix: kind == "Prefix",
                    rl: rl.clone(),
                    regex,
                    default_backend: false,
                };
                let locs = &mut servers[at].1;
                match locs.iter().position(|l| l.path == loc.path && l.exact == loc.exact) {
                    Some(i) if locs[i].default_backend => locs[i] = loc,
                    Some(_) => {}
                    None => locs.push(loc),
                }
            }
        }
    }
    // nginx.tmpl's hash sizes (ConfigMap defaults): the `$limit_<id>` names need them.
    let mut out = String::from(
        "events {}\nhttp {\n    variables_hash_bucket_size 256;\n    variables_hash_max_size 2048;\n    server_names_hash_bucket_size 128;\n",
    );
    let status = |k: &str| cm.get(k).cloned().unwrap_or_else(|| "503".into());
    out += &format!(
        "    limit_req_status {};\n    limit_conn_status {};\n",
        status("limit-req-status-code"),
        status("limit-conn-status-code")
    );
    if cm.get("use-forwarded-headers").is_some_and(|v| v == "true") {
        let header = cm.get("forwarded-for-header").cloned().unwrap_or_else(|| "X-Forwarded-For".into());
        out += &format!("    real_ip_header {header};\n    real_ip_recursive on;\n");
        for c in cm.get("proxy-real-ip-cidr").map_or("0.0.0.0/0", String::as_str).split(',') {
            out += &format!("    set_real_ip_from {};\n", c.trim());
        }
    }
    let key = cm.get("limit-conn-zone-variable").cloned().unwrap_or_else(|| "$binary_remote_addr".into());
    let mut zones = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    for rl in &limits {
        if !seen.insert(rl.id.clone()) {
            continue;
        }
        out += &format!("    geo $remote_addr $allowlist_{} {{\n        default 0;\n", rl.id);
        for ip in &rl.allow {
            out += &format!("        {ip} 1;\n");
        }
        out += &format!(
            "    }}\n    map $allowlist_{0} $limit_{0} {{\n        0 {key};\n        1 \"\";\n    }}\n",
            rl.id
        );
        if rl.conn > 0 {
            zones.insert(format!("limit_conn_zone $limit_{} zone={}_conn:5m;", rl.id, rl.name));
        }
        if rl.rpm > 0 {
            zones.insert(format!("limit_req_zone $limit_{} zone={}_rpm:5m rate={}r/m;", rl.id, rl.name, rl.rpm));
        }
        if rl.rps > 0 {
            zones.insert(format!("limit_req_zone $limit_{} zone={}_rps:5m rate={}r/s;", rl.id, rl.name, rl.rps));
        }
    }
    for z in zones {
        out += &format!("    {z}\n");
    }
    out += &format!("    server {{\n        listen unix:{default_backend};\n        return 404;\n    }}\n");
    for (host, mut locs) in servers {
        // controller.go: sorted by path, then (stably) by length, longest first.
        locs.sort_by(|a, b| b.path.cmp(&a.path));
        locs.sort_by_key(|l| std::cmp::Reverse(l.path.len()));
        // location.go: a Prefix path other than / gets a trailing slash and an exact twin.
        let exacts: Vec<String> = locs.iter().filter(|l| l.exact).map(|l| l.path.clone()).collect();
        let mut all = Vec::new();
        for l in locs {
            if l.path == "/" || !l.prefix || l.rewrite || l.regex {
                all.push(l);
                continue;
            }
            let mut norm = l.clone();
            if !norm.path.ends_with('/') {
                norm.path.push('/');
            }
            let had_exact = exacts.contains(&l.path);
            all.push(norm);
            if !had_exact {
                all.push(Loc { exact: true, prefix: false, ..l });
            }
        }
        let enforce_regex = all.iter().any(|l| l.rewrite || l.regex);
        let default = if host == "_" { " default_server" } else { "" };
        out += &format!("    server {{\n        listen $NGINX{default};\n        server_name {host};\n");
        for l in all {
            let at = if enforce_regex {
                format!("~* \"^{}\"", l.path)
            } else if l.exact {
                format!("= \"{}\"", l.path)
            } else {
                format!("\"{}\"", l.path)
            };
            out += &format!("        location {at} {{\n");
            let rl = &l.rl;
            if rl.conn > 0 {
                out += &format!("            limit_conn {}_conn {};\n", rl.name, rl.conn);
            }
            if rl.rps > 0 {
                out += &format!("            limit_req zone={}_rps burst={} nodelay;\n", rl.name, rl.rps * rl.mult);
            }
            if rl.rpm > 0 {
                out += &format!("            limit_req zone={}_rpm burst={} nodelay;\n", rl.name, rl.rpm * rl.mult);
            }
            if rl.rate_after > 0 {
                out += &format!("            limit_rate_after {}k;\n", rl.rate_after);
            }
            if rl.rate > 0 {
                out += &format!("            limit_rate {}k;\n", rl.rate);
            }
            if l.default_backend {
                out += &format!("            proxy_pass http://unix:{default_backend}:;\n");
            } else {
                out += &format!("            proxy_pass http://{upstream};\n");
            }
            out += "        }\n";
        }
        out += "    }\n";
    }
    out + "}\n"
}

/// ingress-nginx's `encode`: URL-safe base64 without padding.
fn base64_url(s: &str) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// An Ingress differential: the manifest, a ConfigMap appended for the test (where the
/// schedule's clients must be trusted to forward their address), and the schedule's shape.
struct IngressCase {
    case: Case,
    configmap: &'static str,
}

const INGRESS_CASES: &[IngressCase] = &[
    IngressCase {
        case: Case {
            file: "killercoda-rate-limited.yaml",
            paths: &["/", "/a", "/b/c"],
            hosts: &["example.com", "other.test"],
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        // The root of shop.example.com is the default backend carrying checkout-api's limits in
        // ingress-nginx (and a 404 in Weir): not in the schedule (docs/migrating-from-nginx.md).
        case: Case {
            file: "annotations-doc.yaml",
            paths: &["/api/checkout", "/api/checkout/pay", "/api/health", "/api/v1/items", "/API/V2/ITEMS/3"],
            hosts: &["shop.example.com"],
            forwarded: Fwd::Client,
            max_run: 25,
            ..PLAIN
        },
        // The docs trust 10.0.0.0/8; the test's proxy is 127.0.0.1.
        configmap: "proxy-real-ip-cidr: \"10.0.0.0/8,127.0.0.1/32\"",
    },
    IngressCase {
        case: Case {
            file: "limits-every-annotation.yaml",
            paths: &["/v1", "/v1/orders", "/", "/docs"],
            hosts: &["api.example.com", "partners.example.com", "other.test"],
            max_run: 25,
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        case: Case {
            file: "e2e-limit-connections.yaml",
            paths: &["/", "/sleep/0"],
            hosts: &["limit-connections"],
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        case: Case {
            file: "e2e-limit-rate.yaml",
            paths: &["/", "/x"],
            hosts: &["limit-rate-annotation", "other.test"],
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        case: Case { file: "e2e-configmap-limit-rate.yaml", paths: &["/", "/x"], hosts: &["limit-rate"], ..PLAIN },
        configmap: "",
    },
    IngressCase {
        case: Case {
            file: "ratelimit-unit-test.yaml",
            paths: &["/foo", "/foo/", "/foo/bar"],
            hosts: &["foo.bar", "allow.foo.bar"],
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        case: Case {
            file: "nasirnjs-minimal-ingress.yaml",
            paths: &["/", "/index.html"],
            hosts: &["any.test", "localhost"],
            ..PLAIN
        },
        configmap: "",
    },
    IngressCase {
        case: Case {
            file: "hudsonwu-limit-whitelist.yaml",
            paths: &["/", "/notes"],
            hosts: &["study.example.com"],
            ..PLAIN
        },
        configmap: "",
    },
];

fn ingress_differential(c: &IngressCase) -> Tally {
    let upstream = Upstream::start();
    let mut text = std::fs::read_to_string(corpus().join(c.case.file)).unwrap();
    if !c.configmap.is_empty() {
        text += &format!(
            "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ingress-nginx-controller\ndata:\n  {}\n",
            c.configmap
        );
    }
    let sockets = tempfile::tempdir().unwrap();
    let backend = sockets.path().join("default-backend.sock").display().to_string();
    let conf = ingress_nginx_conf(&text, &upstream.addr_str(), &backend);
    let nginx = NginxConf::start(&conf);
    let dir = weir::ConfigDir::new();
    let manifests = dir.write(c.case.file, &text);
    let out = weir::run(
        ["import-ingress", "--upstream", &upstream.addr_str(), "--listen", "$LISTEN", &manifests.display().to_string()],
        Duration::from_secs(30),
    );
    assert!(out.code == Some(0), "{}: {}", c.case.file, out.describe());
    let weir = Weir::start(&out.stdout);
    let t = compare(&c.case, nginx.addr, weir.addr, 48);
    if t.share() < 0.99 {
        eprintln!("{}: the generated nginx config:\n{conf}\nthe import:\n{}", c.case.file, out.stdout);
    }
    t
}

#[test]
fn the_generated_nginx_and_the_import_decide_one_schedule_alike() {
    let mut report = Vec::new();
    let mut failed = Vec::new();
    let mut all_rejected = 0;
    // IMPORT_INGRESS_CASE=file.yaml runs one manifest (when working on it).
    let only = std::env::var("IMPORT_INGRESS_CASE").ok();
    for c in INGRESS_CASES.iter().filter(|c| only.as_deref().is_none_or(|o| o.split(',').any(|f| f == c.case.file))) {
        let t = ingress_differential(c);
        eprintln!("{}", t.line(c.case.file));
        report.push(t.line(c.case.file));
        all_rejected += t.rejected;
        if t.share() < 0.99 {
            failed.push(format!("{}: {:.1} %:\n  {}", c.case.file, t.share() * 100.0, t.diffs.join("\n  ")));
        }
    }
    eprintln!("ingress agreement per manifest:\n  {}", report.join("\n  "));
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(only.is_some() || all_rejected >= 20, "too few limited requests: {}", report.join("; "));
}

#[test]
fn the_oracle_writes_ingress_nginx_zone_names_and_limits() {
    // `encode` is URL-safe base64 without padding (`base64 -w0 | tr +/ -_ | tr -d =`).
    assert_eq!(base64_url("default_foo_"), "ZGVmYXVsdF9mb29f");
    assert_eq!(base64_url("a?>"), "YT8-");
    let text = std::fs::read_to_string(corpus().join("limits-every-annotation.yaml")).unwrap();
    let conf = ingress_nginx_conf(&text, "127.0.0.1:9000", "/tmp/db.sock");
    let zone = "api_public-api_0b6f3e0a-5d0c-4c52-a3b1-8f6e2d9c4a11";
    assert!(conf.contains(&format!("zone={zone}_rps:5m rate=5r/s;")), "{conf}");
    assert!(conf.contains(&format!("limit_req zone={zone}_rps burst=15 nodelay;")), "{conf}");
    assert!(conf.contains(&format!("limit_conn {zone}_conn 10;")), "{conf}");
    assert!(conf.contains("location = \"/v1\" {") && conf.contains("location \"/v1/\" {"), "{conf}");
    assert!(conf.contains("        10.0.0.0/8 1;\n        172.16.0.0/12 1;\n"), "{conf}");
}
