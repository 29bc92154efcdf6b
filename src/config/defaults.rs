//! `[defaults]` and `[[host_defaults]]`: limits, statuses and access rules set once and inherited
//! by the routes that set none of them, as nginx inherits `limit_req`, `limit_conn`, their
//! `*_status` and `allow`/`deny` from `http` and `server` to a `location` that sets none of that
//! directive. Each field is inherited whole (a level that sets any `limit_req` replaces every
//! inherited one); `allow` and `deny` go together. Pure: the routes' schema values are filled in
//! before they are compiled, so an inherited value's errors name the line it was written on.

use std::collections::HashMap;

use super::error::{ConfigError, Source};
use super::schema::{Defaults, HostDefaults, LimitConnRef, LimitReqRef, Route};
use super::spanned::Spanned;

/// allow and deny of one level.
type Access = (Vec<Spanned<String>>, Vec<Spanned<String>>);

/// One level's fields (`[defaults]`, an entry of `[[host_defaults]]`, a route).
#[derive(Debug, Clone, Default)]
struct Level {
    limit_req: Option<Vec<Spanned<LimitReqRef>>>,
    limit_req_status: Option<Spanned<i64>>,
    limit_conn: Option<Vec<Spanned<LimitConnRef>>>,
    limit_conn_status: Option<Spanned<i64>>,
    /// allow and deny, inherited together.
    access: Option<Access>,
    rejection_body: Option<Spanned<String>>,
    rejection_content_type: Option<Spanned<String>>,
}

impl Level {
    /// Fills every field this level does not set from `parent`.
    fn inherit(&mut self, parent: &Level) {
        if self.limit_req.is_none() {
            self.limit_req.clone_from(&parent.limit_req);
        }
        if self.limit_req_status.is_none() {
            self.limit_req_status.clone_from(&parent.limit_req_status);
        }
        if self.limit_conn.is_none() {
            self.limit_conn.clone_from(&parent.limit_conn);
        }
        if self.limit_conn_status.is_none() {
            self.limit_conn_status.clone_from(&parent.limit_conn_status);
        }
        if self.access.is_none() {
            self.access.clone_from(&parent.access);
        }
        if self.rejection_body.is_none() {
            self.rejection_body.clone_from(&parent.rejection_body);
        }
        if self.rejection_content_type.is_none() {
            self.rejection_content_type.clone_from(&parent.rejection_content_type);
        }
    }
}

fn access(allow: Option<Vec<Spanned<String>>>, deny: Option<Vec<Spanned<String>>>) -> Option<Access> {
    match (allow, deny) {
        (None, None) => None,
        (allow, deny) => Some((allow.unwrap_or_default(), deny.unwrap_or_default())),
    }
}

impl From<Defaults> for Level {
    fn from(d: Defaults) -> Level {
        Level {
            limit_req: d.limit_req,
            limit_req_status: d.limit_req_status,
            limit_conn: d.limit_conn,
            limit_conn_status: d.limit_conn_status,
            access: access(d.allow, d.deny),
            rejection_body: d.rejection_body,
            rejection_content_type: d.rejection_content_type,
        }
    }
}

/// A host pattern as routes and entries are compared: lower case, without a trailing dot.
fn host_key(pattern: &str) -> String {
    let lower = pattern.to_ascii_lowercase();
    lower.strip_suffix('.').map(str::to_string).unwrap_or(lower)
}

/// Fills each route's unset fields from the `[[host_defaults]]` entry that holds all its hosts,
/// else from `[defaults]`. A host listed in two entries, and a route whose hosts are not all in
/// one entry, are refused: the route would have two `server`s.
pub(super) fn apply(
    src: &Source<'_>,
    defaults: Option<Spanned<Defaults>>,
    host_defaults: Vec<Spanned<HostDefaults>>,
    routes: &mut [Spanned<Route>],
) -> Result<(), ConfigError> {
    let top: Level = defaults.map(|d| d.into_inner().into()).unwrap_or_default();
    let mut entries: Vec<(usize, Level)> = Vec::new();
    let mut owner: HashMap<String, usize> = HashMap::new();
    for entry in host_defaults {
        let line = src.line_of(&entry.span());
        let HostDefaults {
            hosts,
            limit_req,
            limit_req_status,
            limit_conn,
            limit_conn_status,
            allow,
            deny,
            rejection_body,
            rejection_content_type,
        } = entry.into_inner();
        if hosts.get_ref().is_empty() {
            return Err(src.error_at(&hosts.span(), "host_defaults.hosts: list at least one host"));
        }
        for host in hosts.get_ref() {
            if let Some(first) = owner.insert(host_key(host.get_ref()), entries.len()) {
                return Err(src.error_at(
                    &host.span(),
                    format!(
                        "host_defaults.hosts: {:?} is already in the entry on line {}",
                        host.get_ref(),
                        entries[first].0
                    ),
                ));
            }
        }
        let mut level = Level {
            limit_req,
            limit_req_status,
            limit_conn,
            limit_conn_status,
            access: access(allow, deny),
            rejection_body,
            rejection_content_type,
        };
        level.inherit(&top);
        entries.push((line, level));
    }
    for route in routes.iter_mut() {
        let span = route.span();
        let r = route.get_ref();
        let hosts: Vec<String> = match &r.host {
            None => Vec::new(),
            Some(h) => h.get_ref().items().iter().map(|h| host_key(h)).collect(),
        };
        let in_entry: Vec<Option<usize>> = hosts.iter().map(|h| owner.get(h).copied()).collect();
        let first = in_entry.first().copied().flatten();
        let parent = match in_entry.iter().position(|e| *e != first) {
            None => first.map_or(&top, |i| &entries[i].1),
            Some(split) => {
                let held = in_entry.iter().position(Option::is_some).unwrap_or(0);
                let other = if held == 0 { split } else { 0 };
                let line = |i: usize| in_entry[i].map_or(0, |e| entries[e].0);
                let detail = match in_entry[other] {
                    None => format!(
                        "host {:?} is in no [[host_defaults]] entry but {:?} is (line {})",
                        hosts[other],
                        hosts[held],
                        line(held)
                    ),
                    Some(_) => format!(
                        "hosts {:?} (line {}) and {:?} (line {}) are in different [[host_defaults]] entries",
                        hosts[held],
                        line(held),
                        hosts[other],
                        line(other)
                    ),
                };
                return Err(src.error_at(
                    &span,
                    format!("route {:?}: {detail}; a route inherits from one entry, so give it one", r.name.get_ref()),
                ));
            }
        };
        let parent = parent.clone();
        let route = route.get_mut();
        let mut own = Level {
            limit_req: route.limit_req.take(),
            limit_req_status: route.limit_req_status.take(),
            limit_conn: route.limit_conn.take(),
            limit_conn_status: route.limit_conn_status.take(),
            access: access(route.allow.take(), route.deny.take()),
            rejection_body: route.rejection_body.take(),
            rejection_content_type: route.rejection_content_type.take(),
        };
        own.inherit(&parent);
        route.limit_req = own.limit_req;
        route.limit_req_status = own.limit_req_status;
        route.limit_conn = own.limit_conn;
        route.limit_conn_status = own.limit_conn_status;
        route.rejection_body = own.rejection_body;
        route.rejection_content_type = own.rejection_content_type;
        if let Some((allow, deny)) = own.access {
            route.allow = Some(allow);
            route.deny = Some(deny);
        }
    }
    Ok(())
}
