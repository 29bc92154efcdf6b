//! `[jwt]`: the keys and expectations bearer tokens are verified with for `jwt:` key parts, read
//! at every load (a rotated key file or JWKS takes effect on reload), and the checks that tie
//! key parts to what the config has (`jwt:` needs `[jwt]`, `path:` needs the route's group).

use std::time::Duration;

use super::spanned::Spanned;

use super::checks::parse_duration;
use super::error::{ConfigError, Source};
use super::limit_conn::ConnZone;
use super::limit_req::Zone;
use super::route::Route;
use super::schema;
use super::tls::{base_dir, resolve};
use crate::adaptive::PrioritySource;
use crate::keys::jwt::{Expect, KeySource, Verifier};
use crate::keys::{KeyPart, KeySpec, TokenPolicy};
use crate::routes::{PathMatch, RouteMatcher};

const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
const MAX_LEEWAY: Duration = Duration::from_secs(300);
/// The most a `jwks_file` may hold.
const MAX_JWKS_FILE: u64 = 1024 * 1024;

pub(super) fn compile_jwt(
    src: &Source<'_>,
    jwt: Option<Spanned<schema::Jwt>>,
    warnings: &mut Vec<String>,
) -> Result<Option<Verifier>, ConfigError> {
    let Some(jwt) = jwt else { return Ok(None) };
    let span = jwt.span();
    let schema::Jwt { jwks_file, key_file, algorithm, issuer, audience, leeway } = jwt.into_inner();
    let leeway_secs = match &leeway {
        None => DEFAULT_LEEWAY.as_secs(),
        Some(l) => parse_duration(l.get_ref())
            .filter(|d| *d <= MAX_LEEWAY)
            .ok_or_else(|| {
                src.error_at(
                    &l.span(),
                    format!("jwt.leeway: expected a duration up to \"5m\" like \"30s\", got {:?}", l.get_ref()),
                )
            })?
            .as_secs(),
    };
    let list = |v: Option<Spanned<schema::OneOrMany>>| {
        v.map_or_else(Vec::new, |v| v.get_ref().items().into_iter().map(str::to_string).collect())
    };
    let expect = Expect { issuers: list(issuer), audiences: list(audience), leeway_secs };
    let base = base_dir(src.file);
    // A JWKS of a few dozen keys is tens of KiB; a key file is a few KiB.
    let read = |file: &Spanned<String>, max: u64| {
        let path = resolve(&base, file.get_ref());
        src.outside
            .read_at_most(&path, max)
            .map_err(|e| src.error_at(&file.span(), format!("jwt: cannot read {}: {e}", path.display())))
    };
    let verifier = match (jwks_file, key_file, algorithm) {
        (Some(file), None, None) => {
            let json = read(&file, MAX_JWKS_FILE)?;
            Verifier::new(KeySource::Jwks(&json), &expect)
                .map_err(|e| src.error_at(&file.span(), format!("jwt.jwks_file {:?}: {e}", file.get_ref())))?
        }
        (None, Some(file), Some(alg)) => {
            let mut key = read(&file, super::secrets::MAX_SECRET_FILE)?;
            // An HMAC secret lets whoever reads it sign tokens (a public key does not).
            let path = resolve(&base, file.get_ref());
            if alg.get_ref().starts_with("HS") && src.outside.world_readable(&path) {
                warnings.push(format!(
                    "jwt.key_file: {} is readable by every user of this machine and holds an HMAC secret that signs \
                     tokens; chmod o-r it (e.g. 0600, or 0640 with the group weir runs as)",
                    path.display()
                ));
            }
            // An HMAC secret written with an editor ends with a newline that is not part of it.
            while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                key.pop();
            }
            Verifier::new(KeySource::Single { algorithm: alg.get_ref(), key: &key }, &expect)
                .map_err(|e| src.error_at(&file.span(), format!("jwt.key_file {:?}: {e}", file.get_ref())))?
        }
        _ => {
            return Err(src.error_at(
                &span,
                "jwt: give jwks_file = \"jwks.json\", or key_file = \"key.pem\" with algorithm = \"RS256\"".to_string(),
            ))
        }
    };
    Ok(Some(verifier))
}

/// Every key part names something the config has: `jwt:` parts need `[jwt]`, and a `path:NAME`
/// part needs every route that uses its zone to capture `NAME` in its `path_regex` (else the key
/// would be empty, and an empty key is not limited).
pub(super) fn key_parts_resolve(
    src: &Source<'_>,
    jwt: Option<&Verifier>,
    zones: &[Zone],
    conn_zones: &[ConnZone],
    routes: &[Route],
    matchers: &[RouteMatcher],
) -> Result<(), ConfigError> {
    let all_parts = |spec: &KeySpec| {
        let fallback: &[KeyPart] = match &spec.on_bad_token {
            TokenPolicy::Reject => &[],
            TokenPolicy::Fallback(parts) => parts,
        };
        spec.parts.iter().chain(fallback).cloned().collect::<Vec<_>>()
    };
    let specs = zones
        .iter()
        .map(|z| (format!("limit_req_zone {:?}", z.name), &z.key))
        .chain(conn_zones.iter().map(|z| (format!("limit_conn_zone {:?}", z.name), &z.key)));
    for (what, spec) in specs {
        if jwt.is_none() && spec.reads_claims() {
            return Err(src.error(format!(
                "{what}: its key reads a jwt: claim, but the config has no [jwt] section to verify tokens with"
            )));
        }
    }
    for route in routes {
        let claim = route.priority_from.as_ref().is_some_and(|p| matches!(p.source, PrioritySource::Claim(_)));
        if jwt.is_none() && claim {
            return Err(src.error(format!(
                "route {:?}: priority_from reads a claim, but the config has no [jwt] section to verify tokens with",
                route.name
            )));
        }
    }
    for (route, matcher) in routes.iter().zip(matchers) {
        let rate = route.limits.iter().map(|l| (&zones[l.zone].name, &zones[l.zone].key));
        let conn = route.conn_limits.iter().map(|l| (&conn_zones[l.zone].name, &conn_zones[l.zone].key));
        for (zone, spec) in rate.chain(conn) {
            for part in all_parts(spec) {
                let KeyPart::PathPart(group) = &part else { continue };
                let captured = match &matcher.path {
                    PathMatch::Regex(r) => r.capture_names().flatten().any(|n| n == group),
                    _ => false,
                };
                if !captured {
                    return Err(src.error(format!(
                        "route {:?}: zone {zone:?} is keyed on path:{group}, but the route's path_regex has no group (?P<{group}>…); \
                         the key would be empty and such requests unlimited",
                        route.name
                    )));
                }
            }
        }
    }
    Ok(())
}
