//! Key parts beyond headers and addresses, end to end through the real binary: route-wide and
//! constant keys, IP prefixes (an attacker rotating through one IPv6 /64), verified JWT claims
//! (forged tokens never get a bucket of their own; keys rotate with the JWKS file) and path parts.
//! The TCP peer is always 127.0.0.1; `[real_ip]` trusts it so X-Forwarded-For presents clients.

use crate::support;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use support::admin;
use support::config::{memory_with_app, with_app};
use support::http::{self, Response};
use support::upstream::Upstream;
use support::weir::{check_config, ConfigDir, Weir};

const REAL_IP: &str = r#"[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Forwarded-For""#;

/// A zone `name` keyed by `key` at 1r/m, and a route `/{name}/` limited by it with burst 0.
fn zone_and_route(name: &str, key: &str, extra: &str) -> String {
    format!(
        r#"
[[limit_req_zone]]
name = "{name}"
key = {key}
rate = "1r/m"
{extra}

[[route]]
name = "{name}"
path_prefix = "/{name}/"
upstream = "app"
limit_req = [ {{ zone = "{name}", burst = 0, nodelay = true }} ]
"#
    )
}

fn get(w: &Weir, path: &str, headers: &[(&str, &str)]) -> Response {
    http::get_with(w.addr, path, headers)
}

fn from(w: &Weir, path: &str, client: &str) -> u16 {
    get(w, path, &[("X-Forwarded-For", client)]).status
}

#[test]
fn route_keys_are_one_bucket_per_route_and_const_keys_one_per_zone() {
    let up = Upstream::start();
    let mut text = zone_and_route("per_route", r#""route""#, "");
    text += r#"
[[route]]
name = "other_route"
path_prefix = "/other_route/"
upstream = "app"
limit_req = [ { zone = "per_route", burst = 0, nodelay = true } ]
"#;
    text += &zone_and_route("everyone", r#""const:all""#, "");
    text += r#"
[[route]]
name = "everyone_too"
path_prefix = "/everyone_too/"
upstream = "app"
limit_req = [ { zone = "everyone", burst = 0, nodelay = true } ]
"#;
    text += &zone_and_route("login", r#"["const:login", "ip"]"#, "");
    let w = Weir::start(&memory_with_app(up.addr(), &format!("{REAL_IP}\n{text}")));

    assert_eq!(from(&w, "/per_route/a", "192.0.2.1"), 200);
    assert_eq!(from(&w, "/per_route/b", "192.0.2.2"), 429, "every client of the route shares its bucket");
    assert_eq!(from(&w, "/other_route/a", "192.0.2.1"), 200, "another route of the zone has its own");
    assert_eq!(from(&w, "/everyone/a", "192.0.2.1"), 200);
    assert_eq!(from(&w, "/everyone_too/a", "192.0.2.3"), 429, "a constant key is one bucket for the zone");
    assert_eq!(from(&w, "/login/a", "192.0.2.1"), 200);
    assert_eq!(from(&w, "/login/a", "192.0.2.1"), 429);
    assert_eq!(from(&w, "/login/a", "192.0.2.2"), 200, "composed with ip: one bucket per client");
    assert_eq!(up.hits(), 5);
}

#[test]
fn an_attacker_rotating_through_one_ipv6_64_gets_one_bucket_with_a_64_key() {
    let up = Upstream::start();
    let text = zone_and_route("p64", r#""ip/24""#, "") + &zone_and_route("p128", r#""ip/32,128""#, "");
    let w = Weir::start(&memory_with_app(up.addr(), &format!("{REAL_IP}\n{text}")));
    // 1,000 addresses of 2001:db8:77:1::/64, interface IDs spread over the whole 64 bits.
    let addresses: Vec<String> = (0u64..1000)
        .map(|i| {
            let iid = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            format!(
                "2001:db8:77:1:{:x}:{:x}:{:x}:{:x}",
                iid >> 48,
                (iid >> 32) & 0xffff,
                (iid >> 16) & 0xffff,
                iid & 0xffff
            )
        })
        .collect();
    let count = |route: &str| {
        let statuses: Vec<u16> = addresses.iter().map(|a| from(&w, &format!("/{route}/x"), a)).collect();
        (statuses.iter().filter(|&&s| s == 200).count(), statuses.iter().filter(|&&s| s == 429).count())
    };
    assert_eq!(count("p64"), (1, 999), "ip/24 (IPv6 /64 by default): one bucket for the whole /64");
    assert_eq!(count("p128"), (1000, 0), "ip/32,128: every address its own bucket");
    assert_eq!(from(&w, "/p64/x", "2001:db8:77:2::1"), 200, "the next /64 is another bucket");
    // IPv4 with /24; an IPv4-mapped IPv6 address is the IPv4 address.
    assert_eq!(from(&w, "/p64/x", "198.51.100.1"), 200);
    assert_eq!(from(&w, "/p64/x", "198.51.100.200"), 429, "same /24");
    assert_eq!(from(&w, "/p64/x", "::ffff:198.51.100.7"), 429, "IPv4-mapped: the same /24");
    assert_eq!(from(&w, "/p64/x", "198.51.101.1"), 200);
}

// ---- JWT ----

const SECRET: &str = "weir-test-secret-0123456789abcdef";
const ISSUER: &str = "https://issuer.test";

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn b64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iss": ISSUER, "aud": "weir", "exp": now() + 600, "tenant": { "id": format!("t-{sub}") } })
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs(claims: &Value) -> String {
    sign(Algorithm::HS256, None, &EncodingKey::from_secret(SECRET.as_bytes()), claims)
}

/// A token over a raw header and payload, signed with the test secret.
fn hs_raw(header: &str, payload: &str) -> String {
    let message = format!("{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()));
    let sig =
        jsonwebtoken::crypto::sign(message.as_bytes(), &EncodingKey::from_secret(SECRET.as_bytes()), Algorithm::HS256)
            .unwrap();
    format!("{message}.{sig}")
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn jwt_config(up: &Upstream, jwt: &str) -> String {
    let text = zone_and_route("per_user", r#""jwt:sub""#, "")
        + &zone_and_route("per_tenant", r#""jwt:/tenant/id""#, "")
        + &zone_and_route("user_or_ip", r#""jwt:sub""#, r#"bad_token_key = "ip""#);
    with_app(admin::LISTEN, "[store]\nkind = \"memory\"", up.addr(), &format!("{REAL_IP}\n\n{jwt}\n{text}"))
}

fn hs_config(up: &Upstream, dir: &Path) -> String {
    let secret = dir.join("secret.key");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let jwt = format!(
        "[jwt]\nkey_file = \"{}\"\nalgorithm = \"HS256\"\nissuer = \"{ISSUER}\"\naudience = \"weir\"\nleeway = \"30s\"",
        secret.display()
    );
    jwt_config(up, &jwt)
}

/// Forged, expired or otherwise unverifiable tokens, each for a subject of its own.
fn forged_tokens() -> Vec<(&'static str, String)> {
    let alice = hs(&claims("alice"));
    let mut parts = alice.split('.');
    let (h, _, s) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let none_header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let mut expired = claims("f-expired");
    expired["exp"] = json!(now() - 120);
    let mut early = claims("f-early");
    early["nbf"] = json!(now() + 600);
    let mut other_issuer = claims("f-iss");
    other_issuer["iss"] = json!("https://evil.test");
    let mut other_audience = claims("f-aud");
    other_audience["aud"] = json!("other");
    let mut no_exp = claims("f-noexp");
    no_exp.as_object_mut().unwrap().remove("exp");
    let exp = now() + 600;
    vec![
        ("alg none", format!("{none_header}.{}.", b64(claims("f-none").to_string().as_bytes()))),
        ("alg none, alice's signature", format!("{none_header}.{}.{s}", b64(claims("f-none2").to_string().as_bytes()))),
        ("another key", sign(Algorithm::HS256, None, &EncodingKey::from_secret(b"another secret"), &claims("f-key"))),
        ("modified payload", format!("{h}.{}.{s}", b64(claims("f-mod").to_string().as_bytes()))),
        ("expired", hs(&expired)),
        ("not yet valid", hs(&early)),
        ("other issuer", hs(&other_issuer)),
        ("other audience", hs(&other_audience)),
        ("no exp", hs(&no_exp)),
        (
            "sub given twice",
            hs_raw(
                r#"{"alg":"HS256","typ":"JWT"}"#,
                &format!(r#"{{"sub":"f-dup1","sub":"f-dup2","iss":"{ISSUER}","aud":"weir","exp":{exp}}}"#),
            ),
        ),
        ("garbage", "not-a-jwt".to_string()),
    ]
}

#[test]
fn forged_tokens_never_get_a_bucket_and_two_subjects_get_two() {
    let up = Upstream::start();
    let dir = ConfigDir::new();
    let w = Weir::start(&hs_config(&up, dir.path()));
    let as_user = |path: &str, token: &str| {
        get(&w, path, &[("Authorization", &bearer(token)), ("X-Forwarded-For", "192.0.2.50")])
    };

    let alice = hs(&claims("alice"));
    assert_eq!(as_user("/per_user/x", &alice).status, 200);
    assert_eq!(as_user("/per_user/x", &alice).status, 429, "alice's bucket");
    assert_eq!(as_user("/per_user/x", &hs(&claims("bob"))).status, 200, "bob's own bucket");
    assert_eq!(as_user("/per_tenant/x", &alice).status, 200, "claim by JSON pointer");
    assert_eq!(as_user("/per_tenant/x", &alice).status, 429);
    assert_eq!(as_user("/per_tenant/x", &hs(&claims("bob"))).status, 200, "another tenant");

    // Without a fallback key, a zone refuses every token it cannot verify with 401.
    for (what, token) in forged_tokens() {
        let r = as_user("/per_user/x", &token);
        assert_eq!(r.status, 401, "{what}: {}", r.summary());
        assert_eq!(r.json()["error"], "invalid_token", "{what}");
        assert_eq!(r.header("www-authenticate").as_deref(), Some(r#"Bearer error="invalid_token""#), "{what}");
    }
    // The control for "sub given twice": the same raw signing, one sub, passes.
    let exp = now() + 600;
    let raw = hs_raw(
        r#"{"alg":"HS256","typ":"JWT"}"#,
        &format!(r#"{{"sub":"f-dup0","iss":"{ISSUER}","aud":"weir","exp":{exp}}}"#),
    );
    assert_eq!(as_user("/per_user/x", &raw).status, 200);
    let r = get(&w, "/per_user/x", &[]);
    assert_eq!(r.status, 401, "no token: {}", r.summary());
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    let r =
        get(&w, "/per_user/x", &[("Authorization", &bearer(&alice)), ("Authorization", &bearer(&hs(&claims("eve"))))]);
    assert_eq!(r.status, 400, "two Authorization lines are ambiguous: {}", r.summary());

    // With bad_token_key = "ip", every unverifiable token of one client is that client's one
    // fallback bucket, apart from any verified subject's.
    let forged = forged_tokens();
    assert_eq!(as_user("/user_or_ip/x", &forged[0].1).status, 200, "the client's fallback bucket");
    for (what, token) in &forged[1..] {
        assert_eq!(as_user("/user_or_ip/x", token).status, 429, "{what}: no fresh bucket");
    }
    assert_eq!(get(&w, "/user_or_ip/x", &[("X-Forwarded-For", "192.0.2.50")]).status, 429, "no token: the same");
    assert_eq!(as_user("/user_or_ip/x", &alice).status, 200, "a verified user has a bucket of her own");
    assert_eq!(up.hits(), 7);
}

#[test]
fn keys_rotate_with_the_jwks_file_es256_and_eddsa() {
    let up = Upstream::start();
    let dir = ConfigDir::new();
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let raw = ec.public_key_raw();
    let ec_jwk = json!({ "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "x": b64(&raw[1..33]), "y": b64(&raw[33..]) });
    // No "alg": an OKP key is used with EdDSA.
    let ed_jwk = json!({ "kty": "OKP", "crv": "Ed25519", "kid": "k2", "x": b64(ed.public_key_raw()) });
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({ "keys": [ec_jwk] }).to_string()).unwrap();
    let jwt = format!("[jwt]\njwks_file = \"{}\"\nissuer = \"{ISSUER}\"\naudience = \"weir\"", jwks.display());
    let w = Weir::start(&jwt_config(&up, &jwt));

    let k1 = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
    let k2 = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
    // Signed with k1's key (ES256) or k2's (EdDSA), naming `kid`.
    let token = |signer: &str, kid: &str, sub: &str| match signer {
        "k1" => sign(Algorithm::ES256, Some(kid), &k1, &claims(sub)),
        _ => sign(Algorithm::EdDSA, Some(kid), &k2, &claims(sub)),
    };
    let status = |token: &str| get(&w, "/per_user/x", &[("Authorization", &bearer(token))]).status;
    assert_eq!(status(&token("k1", "k1", "u1")), 200);
    assert_eq!(status(&token("k2", "k2", "u2")), 401, "k2 is not in the JWKS yet");
    assert_eq!(status(&token("k2", "k1", "u3")), 401, "another key under k1's name");
    let no_kid = sign(Algorithm::ES256, None, &k1, &claims("u4"));
    assert_eq!(status(&no_kid), 200, "a token without kid, and the JWKS has one key");

    std::fs::write(&jwks, json!({ "keys": [ed_jwk] }).to_string()).unwrap();
    let r = admin::request(admin::addr(&w), "POST", "/reload", None);
    assert_eq!(r.status, 200, "{}", r.summary());
    let r = get(&w, "/per_user/x", &[("Authorization", &bearer(&token("k2", "k2", "u5")))]);
    assert_eq!(r.status, 200, "rotated in: {}", r.summary());
    assert_eq!(status(&token("k1", "k1", "u6")), 401, "rotated out");
    assert_eq!(status(&token("k2", "k2", "u5")), 429, "u5's bucket, as before");
}

#[test]
fn rs256_key_file_refuses_the_public_key_as_an_hmac_secret() {
    let up = Upstream::start();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jwt");
    let public = data.join("rsa_public.pem");
    // The tokens name an audience: without `audience` they would be refused for that alone.
    let jwt = format!(
        "[jwt]\nkey_file = \"{}\"\nalgorithm = \"RS256\"\nissuer = \"{ISSUER}\"\naudience = \"weir\"",
        public.display()
    );
    let w = Weir::start(&jwt_config(&up, &jwt));
    let private = std::fs::read(data.join("rsa_private.pem")).unwrap();
    let good = sign(Algorithm::RS256, None, &EncodingKey::from_rsa_pem(&private).unwrap(), &claims("u1"));
    let status = |token: &str| get(&w, "/per_user/x", &[("Authorization", &bearer(token))]).status;
    assert_eq!(status(&good), 200);
    let public_pem = std::fs::read(&public).unwrap();
    let confused = sign(Algorithm::HS256, None, &EncodingKey::from_secret(&public_pem), &claims("u2"));
    assert_eq!(status(&confused), 401, "HS256 with the public key as secret");
}

#[test]
fn path_parts_key_on_the_canonical_path() {
    let up = Upstream::start();
    let text = r#"
[[limit_req_zone]]
name = "per_tenant"
key = "path:tenant"
rate = "1r/m"

[[route]]
name = "tenants"
path_regex = "^/tenants/(?P<tenant>[^/]+)/"
upstream = "app"
limit_req = [ { zone = "per_tenant", burst = 0, nodelay = true } ]
"#;
    let w = Weir::start(&memory_with_app(up.addr(), text));
    let status = |path: &str| get(&w, path, &[]).status;
    assert_eq!(status("/tenants/acme/items"), 200);
    assert_eq!(status("/tenants/acme/orders"), 429, "one bucket per tenant, whatever follows");
    assert_eq!(status("/tenants/globex/items"), 200);
    // Other spellings of acme's path are acme's bucket: matched on the canonical path.
    for spelling in
        ["/tenants/%61cme/items", "/tenants/./acme/items", "/x/../tenants/acme/items", "//tenants//acme/items"]
    {
        assert_eq!(status(spelling), 429, "{spelling}");
    }
    assert_eq!(up.hits(), 2);
}

#[test]
fn weir_check_refuses_key_parts_the_config_cannot_fill() {
    let route = |key: &str, path: &str, extra: &str| {
        memory_with_app(
            "127.0.0.1:1".parse().unwrap(),
            &format!(
                r#"
[[limit_req_zone]]
name = "z"
key = {key}
rate = "1r/s"
{extra}

[[route]]
name = "r"
{path}
upstream = "app"
limit_req = [ {{ zone = "z" }} ]
"#
            ),
        )
    };
    // An empty key file (a regular file: devices such as /dev/null are refused as secret files).
    let empty = tempfile::NamedTempFile::new().expect("empty file");
    let empty = empty.path().display().to_string();
    let route = |key: &str, path: &str, extra: &str| route(key, path, &extra.replace("/dev/null", &empty));
    let cases = [
        (route(r#""path:tenant""#, r#"path_prefix = "/tenants/""#, ""), "has no group (?P<tenant>"),
        (route(r#""path:tenant""#, r#"path_regex = "^/t/(?P<other>[^/]+)""#, ""), "has no group (?P<tenant>"),
        (route(r#""jwt:sub""#, r#"path_prefix = "/""#, ""), "no [jwt] section"),
        (route(r#""ip""#, r#"path_prefix = "/""#, r#"bad_token_key = "ip""#), "reads no jwt: claim"),
        (route(r#""ip/0""#, r#"path_prefix = "/""#, ""), "ip/V4LEN"),
        (
            route(
                r#""jwt:sub""#,
                r#"path_prefix = "/""#,
                "[jwt]\nkey_file = \"/nonexistent/k.pem\"\nalgorithm = \"RS256\"",
            ),
            "cannot read /nonexistent/k.pem",
        ),
        (route(r#""jwt:sub""#, r#"path_prefix = "/""#, "[jwt]\nkey_file = \"/dev/null\""), "give jwks_file"),
        (
            route(r#""jwt:sub""#, r#"path_prefix = "/""#, "[jwt]\nkey_file = \"/dev/null\"\nalgorithm = \"none\""),
            "is not one of",
        ),
        (
            route(r#""jwt:sub""#, r#"path_prefix = "/""#, "[jwt]\nkey_file = \"/dev/null\"\nalgorithm = \"HS256\""),
            "the secret is empty",
        ),
        (route(r#""jwt:sub""#, r#"path_prefix = "/""#, "[jwt]\njwks_file = \"/dev/null\""), "not a JWKS document"),
        (
            route(
                r#""jwt:sub""#,
                r#"path_prefix = "/""#,
                "bad_token_key = \"jwt:org\"\n[jwt]\njwks_file = \"/dev/null\"",
            ),
            "cannot read the token",
        ),
        (route(r#""ip/24,129""#, r#"path_prefix = "/""#, ""), "ip/V4LEN"),
    ];
    for (text, expected) in cases {
        let out =
            check_config("keys.toml", &text.replace("$LISTEN", "127.0.0.1:0"), std::time::Duration::from_secs(20));
        assert!(
            out.code == Some(1) && format!("{}{}", out.stderr, out.stdout).contains(expected),
            "{expected}: {}",
            out.describe()
        );
    }
    let ok = route(r#"["path:tenant", "const:x", "route", "ip/24,56"]"#, r#"path_regex = "^/t/(?P<tenant>[^/]+)""#, "");
    let out = check_config("keys.toml", &ok.replace("$LISTEN", "127.0.0.1:0"), std::time::Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn replay_decides_the_new_key_parts_as_the_live_proxy_did() {
    let up = Upstream::start();
    let dir = ConfigDir::new();
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, SECRET).unwrap();
    let jwt = format!(
        "[jwt]\nkey_file = \"{}\"\nalgorithm = \"HS256\"\nissuer = \"{ISSUER}\"\naudience = \"weir\"",
        secret.display()
    );
    let routes = zone_and_route("p64", r#""ip/24""#, "")
        + &zone_and_route("per_route", r#""route""#, "")
        + &zone_and_route("per_user", r#""jwt:sub""#, "")
        + &zone_and_route("user_or_ip", r#""jwt:sub""#, r#"bad_token_key = "ip/32,64""#)
        + r#"
[[limit_req_zone]]
name = "per_tenant"
key = "path:tenant"
rate = "1r/m"

[[route]]
name = "tenants"
path_regex = "^/tenants/(?P<tenant>[^/]+)/"
upstream = "app"
limit_req = [ { zone = "per_tenant", burst = 0, nodelay = true } ]
"#;
    let sections = "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n";
    let w = Weir::start(&with_app("", sections, up.addr(), &format!("{REAL_IP}\n\n{jwt}\n{routes}")));

    let (alice, bob) = (bearer(&hs(&claims("alice"))), bearer(&hs(&claims("bob"))));
    let forged = bearer(&forged_tokens()[2].1);
    // (target, X-Forwarded-For, Authorization)
    let requests: Vec<(&str, &str, &str)> = vec![
        ("/p64/x", "2001:db8::1", ""),
        ("/p64/x", "2001:db8::ffff:2", ""),
        ("/p64/x", "2001:db8:0:1::1", ""),
        ("/per_route/a", "192.0.2.1", ""),
        ("/per_route/b", "192.0.2.2", ""),
        ("/tenants/acme/x", "192.0.2.1", ""),
        ("/tenants/%61cme/y", "192.0.2.1", ""),
        ("/tenants/globex/x", "192.0.2.1", ""),
        ("/per_user/x", "192.0.2.1", &alice),
        ("/per_user/x", "192.0.2.1", &alice),
        ("/per_user/x", "192.0.2.1", &bob),
        ("/per_user/x", "192.0.2.1", &forged),
        ("/user_or_ip/x", "2001:db8::1", &forged),
        ("/user_or_ip/x", "2001:db8::2", ""),
        ("/user_or_ip/x", "2001:db8::3", &alice),
    ];
    let statuses: Vec<u16> = requests
        .iter()
        .map(|(target, xff, auth)| {
            let mut headers = vec![("X-Forwarded-For", *xff)];
            if !auth.is_empty() {
                headers.push(("Authorization", auth));
            }
            // Logged before the next request is sent, so the log's order is the requests'.
            http::get_logged(w.addr, target, &headers).status
        })
        .collect();
    assert_eq!(statuses, [200, 429, 200, 200, 429, 200, 429, 200, 200, 429, 200, 401, 200, 429, 200]);
    let lines = support::poll::poll(
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(50),
        || support::access_log::access_lines(&w),
        |l| l.len() >= requests.len(),
    )
    .unwrap_or_else(|l| panic!("access lines: {l:?}"));
    let live: Vec<String> = lines.iter().map(|l| l["limit_req"].as_str().unwrap_or("?").to_string()).collect();
    assert_eq!(live.iter().filter(|w| *w == "REJECTED").count(), 5, "{live:?}");

    // Logged at the time they were sent: replay judges the tokens' exp at the logged time.
    let sent_at = now() as f64;
    let log: String = requests
        .iter()
        .enumerate()
        .map(|(i, (target, xff, auth))| {
            json!({ "ts": sent_at + i as f64 * 0.01, "ip": "127.0.0.1", "method": "GET", "path": target,
                    "host": "localhost", "xff": xff, "auth": auth })
            .to_string()
                + "\n"
        })
        .collect();
    let log_path = dir.write("requests.jsonl", &log);
    let decisions = dir.path().join("decisions.tsv");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["replay", "-c"])
        .arg(&w.config_path)
        .args(["--json", "--quiet", "--format", "json"])
        .args([
            "--field",
            "ts=ts,ip=ip,method=method,path=path,host=host,header.X-Forwarded-For=xff,header.Authorization=auth",
        ])
        .arg("--decisions")
        .arg(&decisions)
        .arg(&log_path)
        .output()
        .expect("weir replay runs");
    assert!(out.status.success(), "weir replay failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&decisions).expect("decisions written");
    let replayed: Vec<&str> = text.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    assert_eq!(live, replayed, "live vs replayed limit_req words\n{text}");
}

#[test]
fn a_limit_conn_zone_keyed_on_a_claim_refuses_or_falls_back_too() {
    let up = Upstream::start();
    let dir = ConfigDir::new();
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, SECRET).unwrap();
    let text = format!(
        r#"{REAL_IP}

[jwt]
key_file = "{}"
algorithm = "HS256"

[[limit_conn_zone]]
name = "conns_per_user"
key = "jwt:sub"

[[limit_conn_zone]]
name = "conns_per_user_or_ip"
key = "jwt:sub"
bad_token_key = "ip"

[[route]]
name = "strict"
path_prefix = "/strict/"
upstream = "app"
limit_conn = [ {{ zone = "conns_per_user", max = 1 }} ]

[[route]]
name = "lenient"
path_prefix = "/lenient/"
upstream = "app"
limit_conn = [ {{ zone = "conns_per_user_or_ip", max = 1 }} ]
"#,
        secret.display()
    );
    let w = Weir::start(&memory_with_app(up.addr(), &text));
    let alice = bearer(&hs(&json!({ "sub": "alice", "exp": now() + 600 })));
    let forged = bearer(&forged_tokens()[2].1);
    assert_eq!(get(&w, "/strict/x", &[("Authorization", &alice)]).status, 200);
    let r = get(&w, "/strict/x", &[("Authorization", &forged)]);
    assert_eq!(r.status, 401, "{}", r.summary());
    assert_eq!(get(&w, "/strict/x", &[]).status, 401);
    assert_eq!(get(&w, "/lenient/x", &[("Authorization", &forged), ("X-Forwarded-For", "192.0.2.9")]).status, 200);
    assert_eq!(up.hits(), 2);
}
