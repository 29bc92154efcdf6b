//! Secrets out of the config file, with the real binary: a Redis password from `${NAME}` (the
//! Redis requires it), the admin token from a file mounted the way Kubernetes mounts a Secret
//! (`token -> ..data/token`, `..data -> ..<timestamp>`), rotated by the kubelet's symlink swap and
//! applied without a restart. No output — logs, `weir check`, `GET /config`, errors — shows either.

use crate::support;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::poll::poll;
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::Weir;
use support::{admin, config};

const PASSWORD: &str = "redis-pw-4f1c9a7e2b";
const TOKEN_1: &str = "token-one-8d3e5c1a9b7f2d4e";
const TOKEN_2: &str = "token-two-2b6f0e9c4d8a1f3e";
const PASSWORD_VAR: &str = "WEIR_TEST_REDIS_PASSWORD";
const RELOAD_TIMEOUT: Duration = Duration::from_secs(15);

/// Creates `link -> target` under a temporary name and renames it over `link`: the kubelet's
/// atomic swap.
/// A redis-server that refuses every command before `AUTH PASSWORD`.
fn redis_with_password() -> RedisServer {
    let redis = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query(&mut redis.connection())
        .expect("CONFIG SET requirepass");
    redis
}

fn swap_symlink(dir: &Path, link: &str, target: &str) {
    let tmp = dir.join(format!("{link}_tmp"));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).expect("symlink");
    fs::rename(&tmp, dir.join(link)).expect("rename over");
}

/// A Secret volume as the kubelet lays it out, holding `token`.
fn secret_volume(dir: &Path, stamp: &str, token: &str) {
    let data = dir.join(stamp);
    fs::create_dir(&data).expect("mkdir");
    fs::write(data.join("token"), format!("{token}\n")).expect("write token");
    swap_symlink(dir, "..data", stamp);
    if fs::symlink_metadata(dir.join("token")).is_err() {
        std::os::unix::fs::symlink("..data/token", dir.join("token")).expect("token symlink");
    }
}

fn weir_check(config_path: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(support::weir::bin())
        .args(["check", "-c"])
        .arg(config_path)
        .env_remove(PASSWORD_VAR)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run weir check");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// `/readyz` until 200 (the store answers with the password), or panics with its last answer.
fn wait_ready(admin_addr: std::net::SocketAddr, what: &str) {
    let ready = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || admin::request(admin_addr, "GET", "/readyz", None),
        |r| r.status == 200,
    );
    if let Err(last) = ready {
        panic!("{what}: not ready within 10 s: {}", last.text());
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [PASSWORD, TOKEN_1, TOKEN_2] {
        assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
    }
}

fn config_text(redis_port: u16, token_file: &Path, up: &Upstream) -> String {
    config::with_app(
        &format!("{}\nadmin_token_file = \"{}\"", admin::LISTEN, token_file.display()),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://:${{{PASSWORD_VAR}}}@127.0.0.1:{redis_port}/0\"\non_error = \"deny\"\ntimeout = \"5s\""
        ),
        up.addr(),
        r#"[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "100r/s"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
limit_req = [{ zone = "per_ip", burst = 10 }]
"#,
    )
}

#[test]
fn secrets_from_the_environment_and_a_rotated_secret_file_never_show() {
    let redis = redis_with_password();
    let up = Upstream::start();
    let secrets = tempfile::tempdir().expect("tempdir");
    secret_volume(secrets.path(), "..2024_01_01_00_00_00.1", TOKEN_1);
    let token_file = secrets.path().join("token");
    let text = config_text(redis.port(), &token_file, &up);
    let mut weir = Weir::start_with_env(&text, &[(PASSWORD_VAR, PASSWORD)]);
    let admin_addr = admin::addr(&weir);
    let bearer = |t: &str| format!("Bearer {t}");

    // The password reached Redis: the store decides (on_error = deny would reject otherwise).
    wait_ready(admin_addr, "the password from the environment");
    let r = support::http::must_send(weir.addr, &support::http::Request::get("/x"));
    assert_eq!(r.status, 200, "{}", r.summary());
    let mut conn = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}/0", redis.port()))
        .expect("client")
        .get_connection()
        .expect("connect with the password");
    let keys: Vec<String> = redis::cmd("KEYS").arg("weir:*").query(&mut conn).expect("KEYS");
    assert!(!keys.is_empty(), "the request's decision left no key in Redis");

    // The token from the file guards the admin API; /config says where secrets came from.
    assert_eq!(admin::request(admin_addr, "GET", "/config", None).status, 401);
    let status = admin::request(admin_addr, "GET", "/config", Some(&bearer(TOKEN_1)));
    assert_eq!(status.status, 200, "{}", status.text());
    let body = status.text();
    assert_no_secret("GET /config", &body);
    let json = status.json();
    let from_file = format!("file {}", token_file.display());
    assert!(
        json["secrets"].as_array().is_some_and(|s| s
            .iter()
            .any(|s| s["setting"] == "server.admin_token" && s["from"].as_str() == Some(from_file.as_str()))),
        "{body}"
    );
    assert!(
        json["environment"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["setting"] == "store.url" && e["variables"][0].as_str() == Some(PASSWORD_VAR))),
        "{body}"
    );

    // Rotate the token as the kubelet updates a Secret: new timestamped dir, `..data` swapped.
    secret_volume(secrets.path(), "..2024_01_01_00_00_01.2", TOKEN_2);
    fs::remove_dir_all(secrets.path().join("..2024_01_01_00_00_00.1")).expect("remove old dir");
    let rotated = poll(
        RELOAD_TIMEOUT,
        Duration::from_millis(100),
        || admin::request(admin_addr, "GET", "/config", Some(&bearer(TOKEN_2))).status,
        |&s| s == 200,
    );
    assert_eq!(rotated, Ok(200), "the rotated token was not applied:\n{}", weir.stderr());
    assert_eq!(admin::request(admin_addr, "GET", "/config", Some(&bearer(TOKEN_1))).status, 401);
    let status = admin::request(admin_addr, "GET", "/config", Some(&bearer(TOKEN_2))).json();
    assert_eq!(status["generation"], 2, "{status}");
    assert_no_secret("GET /config after the rotation", &status.to_string());

    // `weir check`: where the secrets come from, not what they are.
    let (code, out) = weir_check(&weir.config_path, &[(PASSWORD_VAR, PASSWORD)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("server.admin_token: from file"), "{out}");
    assert!(out.contains(&format!("store.url: from the environment (${{{PASSWORD_VAR}}})")), "{out}");
    assert_no_secret("weir check", &out);

    // Unset: an error naming the variable and the line, not an empty password.
    let (code, out) = weir_check(&weir.config_path, &[]);
    assert_eq!(code, Some(1), "{out}");
    let line = config::line_of(&text, "url = ");
    assert!(out.contains(&format!(":{line}: store.url: the environment variable {PASSWORD_VAR} is not set")), "{out}");

    // An error about a setting filled from the environment shows the variable, not its value.
    let bad = weir.config_path.with_file_name("bad.toml");
    fs::write(&bad, text.replace("threads = 2", &format!("threads = 2\nadmin_insecure = \"${{{PASSWORD_VAR}}}\"")))
        .expect("write");
    let (code, out) = weir_check(&bad, &[(PASSWORD_VAR, PASSWORD)]);
    assert_eq!(code, Some(1), "{out}");
    assert_no_secret("a refused config", &out);
    let bad_listen = text.replace("listen = [\"", &format!("listen = [\"${{{PASSWORD_VAR}}}\", \""));
    fs::write(&bad, bad_listen).expect("write");
    let (code, out) = weir_check(&bad, &[(PASSWORD_VAR, PASSWORD)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("\"${{{PASSWORD_VAR}}}\" is not an IP:port address")), "{out}");
    assert_no_secret("a refused config", &out);

    weir.terminate(Duration::from_secs(10));
    assert_no_secret("weir's log", &format!("{}{}", weir.stdout(), weir.stderr()));
}

#[test]
fn url_file_and_password_file_reach_redis() {
    let redis = redis_with_password();
    let up = Upstream::start();
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(dir.path().join("password"), format!("{PASSWORD}\n")).expect("write");
    fs::write(dir.path().join("url"), format!("redis://:{PASSWORD}@127.0.0.1:{}/0\n", redis.port())).expect("write");
    for store in [
        format!(
            "url = \"redis://127.0.0.1:{}/0\"\npassword_file = \"{}\"",
            redis.port(),
            dir.path().join("password").display()
        ),
        format!("url_file = \"{}\"", dir.path().join("url").display()),
    ] {
        let text = config::with_app(
            admin::LISTEN,
            &format!("[store]\nkind = \"redis\"\n{store}\non_error = \"deny\""),
            up.addr(),
            "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
        );
        let mut weir = Weir::start(&text);
        wait_ready(admin::addr(&weir), &store);
        let config = admin::request(admin::addr(&weir), "GET", "/config", None).text();
        assert_no_secret("GET /config", &config);
        weir.terminate(Duration::from_secs(10));
        assert_no_secret("weir's log", &format!("{}{}", weir.stdout(), weir.stderr()));
    }
}
