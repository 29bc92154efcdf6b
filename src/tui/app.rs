//! `weir top`'s state and keys, apart from the terminal (unit-tested).

use std::collections::HashMap;
use std::time::Instant;

use crossterm::event::KeyCode;

use super::model::{self, KeyRow, Rates, Sort, Top};

/// Keys asked per zone and list.
pub const KEYS_PER_ZONE: usize = 20;

pub struct App {
    pub admin: String,
    pub top: Top,
    /// Per route / zone name, rates between the last two readings.
    pub route_rates: HashMap<String, Rates>,
    pub zone_rates: HashMap<String, Rates>,
    previous: Option<(Instant, Top)>,
    pub sort: Sort,
    pub selected: usize,
    /// A reset waiting for `y`: (zone, id, key as shown).
    pub confirm: Option<(String, String, String)>,
    /// The latest error or result, shown in the footer.
    pub message: Option<String>,
}

/// What the event loop does after a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Stay,
    Quit,
    Reset { zone: String, id: String },
}

impl App {
    pub fn new(admin: String) -> Self {
        Self {
            admin,
            top: Top::default(),
            route_rates: HashMap::new(),
            zone_rates: HashMap::new(),
            previous: None,
            sort: Sort::Rejected,
            selected: 0,
            confirm: None,
            message: None,
        }
    }

    /// A new reading (or the error of trying).
    pub fn update(&mut self, reading: Result<Top, String>, at: Instant) {
        let top = match reading {
            Ok(top) => top,
            Err(e) => {
                self.message = Some(e);
                return;
            }
        };
        if self.message.as_deref().is_some_and(|m| !m.starts_with("reset")) {
            self.message = None;
        }
        if let Some((then, before)) = &self.previous {
            let seconds = at.duration_since(*then).as_secs_f64();
            self.route_rates = top
                .routes
                .iter()
                .map(|r| {
                    let old = before.routes.iter().find(|b| b.route == r.route).map(|b| &b.requests);
                    (r.route.clone(), model::rates(old, &r.requests, seconds))
                })
                .collect();
            self.zone_rates = top
                .zones
                .iter()
                .map(|z| {
                    let old = before.zones.iter().find(|b| b.zone == z.zone).map(|b| &b.decisions);
                    (z.zone.clone(), model::rates(old, &z.decisions, seconds))
                })
                .collect();
        }
        self.top = top.clone();
        self.previous = Some((at, top));
        self.selected = self.selected.min(self.keys().len().saturating_sub(1));
    }

    pub fn keys(&self) -> Vec<(String, KeyRow)> {
        model::keys(&self.top, self.sort)
    }

    pub fn key(&mut self, code: KeyCode) -> Step {
        if let Some((zone, id, _)) = self.confirm.take() {
            if matches!(code, KeyCode::Char('y') | KeyCode::Char('Y')) {
                return Step::Reset { zone, id };
            }
            self.message = Some("reset cancelled".into());
            return Step::Stay;
        }
        let count = self.keys().len();
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return Step::Quit,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.selected = 0;
            }
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(count.saturating_sub(1)),
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Char('r') | KeyCode::Delete => match self.keys().into_iter().nth(self.selected) {
                Some((zone, row)) => self.confirm = Some((zone, row.id, row.key)),
                None => self.message = Some("no key to reset".into()),
            },
            _ => {}
        }
        Step::Stay
    }

    pub fn reset_done(&mut self, outcome: Result<String, String>) {
        self.message = Some(match outcome {
            Ok(text) => text,
            Err(e) => format!("reset failed: {e}"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::model::ZoneInfo;

    fn top(rows: &[(&str, f64)]) -> Top {
        Top {
            zones: vec![ZoneInfo {
                zone: "z".into(),
                rejected: rows
                    .iter()
                    .map(|(k, r)| KeyRow {
                        id: format!("id-{k}"),
                        key: k.to_string(),
                        rejected_rate: *r,
                        ..KeyRow::default()
                    })
                    .collect(),
                ..ZoneInfo::default()
            }],
            ..Top::default()
        }
    }

    #[test]
    fn reset_needs_confirmation() {
        let mut app = App::new("a".into());
        app.update(Ok(top(&[("one", 5.0), ("two", 1.0)])), Instant::now());
        assert_eq!(app.key(KeyCode::Down), Step::Stay);
        assert_eq!(app.key(KeyCode::Char('r')), Step::Stay);
        assert_eq!(app.confirm.as_ref().map(|c| c.2.as_str()), Some("two"));
        assert_eq!(app.key(KeyCode::Char('n')), Step::Stay, "anything but y cancels");
        assert!(app.confirm.is_none());
        app.key(KeyCode::Char('r'));
        assert_eq!(app.key(KeyCode::Char('y')), Step::Reset { zone: "z".into(), id: "id-two".into() });
        assert_eq!(app.key(KeyCode::Char('q')), Step::Quit);
    }

    #[test]
    fn selection_stays_within_the_list() {
        let mut app = App::new("a".into());
        app.update(Ok(top(&[("one", 5.0), ("two", 1.0)])), Instant::now());
        for _ in 0..5 {
            app.key(KeyCode::Down);
        }
        assert_eq!(app.selected, 1);
        app.update(Ok(top(&[("one", 5.0)])), Instant::now());
        assert_eq!(app.selected, 0);
        app.update(Err("down".into()), Instant::now());
        assert_eq!(app.message.as_deref(), Some("down"));
        assert_eq!(app.top.zones[0].rejected.len(), 1, "an error keeps the last reading");
    }
}
