//! Verified JWT claims as key parts (`jwt:sub`, `jwt:/org/id`). Weir checks the bearer token
//! itself — signature with a configured key, `exp`/`nbf` with a small leeway, expected `iss` and
//! `aud` — so a client cannot pick its own bucket by writing a claim. A payload that names one
//! key twice is refused: an upstream reading the other copy would see another user.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use http::header::{HeaderMap, AUTHORIZATION};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Where the verifying keys come from (`[jwt]`).
pub enum KeySource<'a> {
    /// A JWKS document (`jwks_file`): each key's `alg` (or its type's usual one) and `kid`.
    Jwks(&'a [u8]),
    /// One key (`key_file`) for one algorithm: a secret for HS*, a PEM public key otherwise.
    Single { algorithm: &'a str, key: &'a [u8] },
}

/// What a token must say besides its signature.
pub struct Expect {
    pub issuers: Vec<String>,
    pub audiences: Vec<String>,
    pub leeway_secs: u64,
}

struct VerifyingKey {
    kid: Option<String>,
    key: DecodingKey,
    /// Exactly this key's algorithm: a token naming another one (`none`, HS256 for an RSA key)
    /// is refused before any signature check.
    validation: Validation,
}

/// The compiled `[jwt]` section: keys and expectations, rebuilt by every config load (so a
/// rotated JWKS file is read on reload).
pub struct Verifier {
    keys: Vec<VerifyingKey>,
    /// `exp`/`nbf` leeway (checked here against the request's time, not by jsonwebtoken).
    leeway_secs: u64,
    /// No `audience` configured: a token that names one is for another service and refused
    /// (checked here, so that the rule does not hang on jsonwebtoken's default).
    refuse_any_audience: bool,
    /// SHA-256 of the key material, so that a reload with a rotated key file is a change.
    fingerprint: [u8; 32],
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kids: Vec<_> = self.keys.iter().map(|k| (k.kid.as_deref(), k.validation.algorithms[0])).collect();
        f.debug_struct("Verifier").field("keys", &kids).finish()
    }
}

/// Why a request has no verified claim: each answers 401 or the zone's `bad_token_key`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no bearer token")]
    Absent,
    #[error("the bearer token is not a JWT")]
    Malformed,
    #[error("the token's key is unknown (kid {0:?})")]
    UnknownKey(Option<String>),
    #[error("the token was refused: {0}")]
    Refused(String),
    #[error("the verified token has no claim {0}")]
    MissingClaim(String),
}

impl Verifier {
    pub fn new(source: KeySource<'_>, expect: &Expect) -> Result<Verifier, String> {
        use sha2::{Digest, Sha256};
        let fingerprint = Sha256::digest(match &source {
            KeySource::Jwks(json) => json,
            KeySource::Single { key, .. } => key,
        })
        .into();
        let keys = match source {
            KeySource::Single { algorithm, key } => {
                let alg = Algorithm::from_str(algorithm).map_err(|_| {
                    format!("algorithm: {algorithm:?} is not one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA")
                })?;
                vec![VerifyingKey { kid: None, key: single_key(alg, key)?, validation: validation(alg, expect) }]
            }
            KeySource::Jwks(json) => {
                let set: JwkSet = serde_json::from_slice(json).map_err(|e| format!("not a JWKS document: {e}"))?;
                let mut keys = Vec::with_capacity(set.keys.len());
                for (i, jwk) in set.keys.iter().enumerate() {
                    let kid = jwk.common.key_id.clone();
                    let which = || format!("key {i} (kid {kid:?})");
                    let alg = match jwk.common.key_algorithm {
                        Some(a) => Algorithm::from_str(&a.to_string())
                            .map_err(|_| format!("{}: alg {a} cannot verify signatures", which()))?,
                        None => usual_algorithm(&jwk.algorithm)
                            .ok_or_else(|| format!("{}: give its \"alg\" (no usual one for its key type)", which()))?,
                    };
                    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("{}: {e}", which()))?;
                    keys.push(VerifyingKey { kid, key, validation: validation(alg, expect) });
                }
                if keys.is_empty() {
                    return Err("the JWKS document has no key".into());
                }
                keys
            }
        };
        Ok(Verifier {
            keys,
            leeway_secs: expect.leeway_secs,
            refuse_any_audience: expect.audiences.is_empty(),
            fingerprint,
        })
    }

    /// Identifies the key material (a reload compares it to tell a rotated key from no change).
    pub fn fingerprint(&self) -> &[u8] {
        &self.fingerprint
    }

    /// The request's bearer token, verified, as its claims; `exp` and `nbf` against `now_secs`
    /// (seconds since the Unix epoch: the request's own time, which for a replayed log is the
    /// logged one, not today's).
    pub fn verify(&self, headers: &HeaderMap, now_secs: u64) -> Result<Claims, TokenError> {
        let token = bearer(headers)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let key = match &header.kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid.as_str())),
            // Without a kid, only a lone key can be meant.
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
        .ok_or_else(|| TokenError::UnknownKey(header.kid.clone()))?;
        let data = jsonwebtoken::decode::<Strict>(token, &key.key, &key.validation)
            .map_err(|e| TokenError::Refused(e.to_string()))?;
        self.check_times(&data.claims.0, now_secs)?;
        if self.refuse_any_audience && data.claims.0.get("aud").is_some() {
            return Err(TokenError::Refused(
                "InvalidAudience (the token names an audience; none is configured)".into(),
            ));
        }
        Ok(Claims(data.claims.0))
    }

    /// `exp` and `nbf` with the leeway, as jsonwebtoken checks them against the system clock
    /// (which it does not let us give): expired when `exp < now - leeway`, not yet valid when
    /// `nbf > now + leeway`. `exp` is required (checked present by the validation); `nbf` is
    /// optional; either must be a number.
    fn check_times(&self, claims: &Value, now_secs: u64) -> Result<(), TokenError> {
        let time = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| TokenError::Refused(format!("{name} is not a number"))),
        };
        let now = now_secs as f64;
        let leeway = self.leeway_secs as f64;
        if time("exp")?.is_some_and(|exp| exp < now - leeway) {
            return Err(TokenError::Refused("ExpiredSignature".into()));
        }
        if time("nbf")?.is_some_and(|nbf| nbf > now + leeway) {
            return Err(TokenError::Refused("ImmatureSignature".into()));
        }
        Ok(())
    }
}

fn validation(alg: Algorithm, expect: &Expect) -> Validation {
    let mut v = Validation::new(alg);
    // Times are checked against the request's own time (`Verifier::check_times`).
    v.validate_exp = false;
    v.validate_nbf = false;
    let mut required: HashSet<String> = ["exp".to_string()].into();
    if !expect.issuers.is_empty() {
        v.set_issuer(&expect.issuers);
        required.insert("iss".into());
    }
    if expect.audiences.is_empty() {
        // Refused in `Verifier::verify` when present (a token for another service).
        v.validate_aud = false;
    } else {
        v.set_audience(&expect.audiences);
        required.insert("aud".into());
    }
    v.required_spec_claims = required;
    v
}

fn single_key(alg: Algorithm, key: &[u8]) -> Result<DecodingKey, String> {
    use Algorithm::*;
    let pem =
        |r: jsonwebtoken::errors::Result<DecodingKey>| r.map_err(|e| format!("not a PEM public key for {alg:?}: {e}"));
    match alg {
        HS256 | HS384 | HS512 if key.is_empty() => Err("the secret is empty".into()),
        HS256 | HS384 | HS512 => Ok(DecodingKey::from_secret(key)),
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => pem(DecodingKey::from_rsa_pem(key)),
        ES256 | ES384 => pem(DecodingKey::from_ec_pem(key)),
        EdDSA => pem(DecodingKey::from_ed_pem(key)),
    }
}

/// The algorithm a JWK without `alg` is used with.
fn usual_algorithm(params: &AlgorithmParameters) -> Option<Algorithm> {
    match params {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        AlgorithmParameters::OctetKey(_) => Some(Algorithm::HS256),
    }
}

/// `Authorization: Bearer <token>` (scheme case-insensitive, RFC 6750); one header line only.
fn bearer(headers: &HeaderMap) -> Result<&str, TokenError> {
    let mut lines = headers.get_all(AUTHORIZATION).iter();
    let line = lines.next().ok_or(TokenError::Absent)?;
    if lines.next().is_some() {
        return Err(TokenError::Malformed);
    }
    let text = line.to_str().map_err(|_| TokenError::Malformed)?;
    let (scheme, token) = text.split_once(' ').ok_or(TokenError::Absent)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::Absent);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(TokenError::Malformed);
    }
    Ok(token)
}

/// A verified token's claims.
#[derive(Debug, Clone)]
pub struct Claims(Value);

impl Claims {
    /// A claim by name (`sub`) or JSON pointer (`/org/id`), as key bytes: a string as it is, a
    /// number or boolean as JSON text; `None` for anything else (absent, null, object, array).
    pub fn get(&self, claim: &str) -> Option<Vec<u8>> {
        let value = if claim.starts_with('/') { self.0.pointer(claim) } else { self.0.get(claim) };
        match value? {
            Value::String(s) => Some(s.as_bytes().to_vec()),
            v @ (Value::Number(_) | Value::Bool(_)) => Some(v.to_string().into_bytes()),
            _ => None,
        }
    }
}

/// A JSON value that refuses an object naming a key twice, at any depth (serde_json keeps the
/// last copy; other parsers keep the first).
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!("claim {key:?} is given twice")));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let parse = |s: &str| serde_json::from_str::<Strict>(s).map(|v| v.0);
        assert!(parse(r#"{"sub":"a","sub":"b"}"#).is_err());
        assert!(parse(r#"{"org":{"id":1,"id":2}}"#).is_err());
        assert!(parse(r#"{"l":[{"x":1,"x":1}]}"#).is_err());
        assert_eq!(parse(r#"{"sub":"a","n":[1,2.5,null,true]}"#).unwrap()["n"][1], 2.5);
    }

    /// `exp` and `nbf` are judged at the time the caller gives (a replayed request's logged
    /// time), with the leeway, at the exact bounds jsonwebtoken uses.
    #[test]
    fn token_times_are_judged_at_the_given_time() {
        let secret = b"a-shared-secret-of-32-bytes-long";
        let expect = Expect { issuers: vec![], audiences: vec![], leeway_secs: 30 };
        let verifier = Verifier::new(KeySource::Single { algorithm: "HS256", key: secret }, &expect).unwrap();
        let token = |claims: serde_json::Value| {
            let key = jsonwebtoken::EncodingKey::from_secret(secret);
            let jwt = jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key).unwrap();
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, format!("Bearer {jwt}").parse().unwrap());
            h
        };
        let at = |h: &HeaderMap, now: u64| verifier.verify(h, now).map(|_| ());
        // Issued for 2023: valid then, long expired today.
        let old = token(serde_json::json!({"sub": "u1", "exp": 1_700_000_600u64, "nbf": 1_700_000_000u64}));
        assert_eq!(at(&old, 1_700_000_300), Ok(()));
        assert_eq!(at(&old, 1_700_000_630), Ok(()), "exp + leeway is still valid");
        assert!(at(&old, 1_700_000_631).is_err(), "past exp + leeway");
        assert_eq!(at(&old, 1_699_999_970), Ok(()), "nbf - leeway is already valid");
        assert!(at(&old, 1_699_999_969).is_err(), "before nbf - leeway");
        assert!(at(&old, crate::tls::unix_now() as u64).is_err(), "expired today");
        let text_exp = token(serde_json::json!({"sub": "u1", "exp": "soon"}));
        assert!(at(&text_exp, 1_700_000_000).is_err(), "exp must be a number");
    }

    /// Without `audience`, a token naming any audience is for another service (docs/keys.md);
    /// with it, only the configured ones pass.
    #[test]
    fn audience_is_refused_unless_configured() {
        let secret = b"a-shared-secret-of-32-bytes-long";
        let verify = |audiences: Vec<String>, claims: serde_json::Value| {
            let expect = Expect { issuers: vec![], audiences, leeway_secs: 30 };
            let verifier = Verifier::new(KeySource::Single { algorithm: "HS256", key: secret }, &expect).unwrap();
            let key = jsonwebtoken::EncodingKey::from_secret(secret);
            let jwt = jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key).unwrap();
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, format!("Bearer {jwt}").parse().unwrap());
            verifier.verify(&h, 1_700_000_000).map(|_| ())
        };
        let exp = 1_700_000_600u64;
        assert_eq!(verify(vec![], serde_json::json!({"sub": "u", "exp": exp})), Ok(()));
        for aud in
            [serde_json::json!("api"), serde_json::json!(["api"]), serde_json::json!([]), serde_json::json!(null)]
        {
            let refused = verify(vec![], serde_json::json!({"sub": "u", "exp": exp, "aud": aud}));
            assert!(matches!(refused, Err(TokenError::Refused(_))), "aud {aud}: {refused:?}");
        }
        let api = || vec!["api".to_string()];
        assert_eq!(verify(api(), serde_json::json!({"sub": "u", "exp": exp, "aud": "api"})), Ok(()));
        assert!(verify(api(), serde_json::json!({"sub": "u", "exp": exp, "aud": "other"})).is_err());
        assert!(verify(api(), serde_json::json!({"sub": "u", "exp": exp})).is_err(), "aud required when configured");
    }

    #[test]
    fn claims_by_name_or_pointer() {
        let c = Claims(serde_json::json!({"sub": "u1", "org": {"id": 7, "tags": ["a"]}, "admin": true, "n": null}));
        assert_eq!(c.get("sub"), Some(b"u1".to_vec()));
        assert_eq!(c.get("/org/id"), Some(b"7".to_vec()));
        assert_eq!(c.get("admin"), Some(b"true".to_vec()));
        for absent in ["nope", "n", "org", "/org/tags", "/org/none"] {
            assert_eq!(c.get(absent), None, "{absent}");
        }
    }

    #[test]
    fn bearer_scheme_and_lines() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), Err(TokenError::Absent));
        h.insert(AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
        assert_eq!(bearer(&h), Err(TokenError::Absent));
        h.insert(AUTHORIZATION, "bearer  a.b.c ".parse().unwrap());
        assert_eq!(bearer(&h), Ok("a.b.c"));
        h.append(AUTHORIZATION, "Bearer x.y.z".parse().unwrap());
        assert_eq!(bearer(&h), Err(TokenError::Malformed), "two lines: which one would the upstream read?");
    }
}
