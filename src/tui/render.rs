//! Draws `weir top`'s screen from the app's state.

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::app::App;
use super::model::Rates;

fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn rate_cells(r: Option<&Rates>) -> [String; 4] {
    let r = r.copied().unwrap_or_default();
    [rate(r.requests), rate(r.passed), rate(r.delayed), rate(r.rejected)]
}

/// Text as the terminal may show it: control and format characters (a query key may decode to
/// an escape sequence, a name may hold U+202E) written as `\u{…}`. The client escapes every
/// reply already (`client::safe_json`); this holds for text made here too (messages).
fn printable(text: &str) -> String {
    crate::top::text::escape(text).into_owned()
}

pub fn draw(frame: &mut Frame<'_>, app: &App) {
    let top = &app.top;
    let adaptive = top.adaptive().count();
    // The adaptive panel takes no room when no upstream has an adaptive limit.
    let adaptive_height = if adaptive == 0 { 0 } else { adaptive.min(8) as u16 + 3 };
    let [header, routes_area, zones_area, adaptive_area, keys_area, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(top.routes.len().clamp(1, 8) as u16 + 3),
        Constraint::Length(top.zones.len().clamp(1, 8) as u16 + 3),
        Constraint::Length(adaptive_height),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    let store = if top.store.ready { "ready" } else { "NOT READY" };
    frame.render_widget(
        Paragraph::new(format!(
            "weir top — {}  instance {}  store {} ({store})  instances {}",
            printable(&app.admin),
            top.instance,
            top.store.kind,
            top.instances
        ))
        .style(Style::default().add_modifier(Modifier::BOLD)),
        header,
    );

    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = top.routes.iter().map(|r| {
        let [req, passed, delayed, rejected] = rate_cells(app.route_rates.get(&r.route));
        Row::new(vec![r.route.clone(), r.zones.join(","), req, passed, delayed, rejected])
    });
    let widths = [
        Constraint::Percentage(25),
        Constraint::Percentage(25),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(10),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["route", "zones", "req/s", "passed/s", "delayed/s", "rejected/s"]).style(bold))
            .block(Block::default().borders(Borders::ALL).title(format!("routes ({})", top.scope.routes))),
        routes_area,
    );

    let rows = top.zones.iter().map(|z| {
        let [req, passed, delayed, rejected] = rate_cells(app.zone_rates.get(&z.zone));
        Row::new(vec![z.zone.clone(), z.key.clone(), z.rate.clone(), req, passed, delayed, rejected])
    });
    let widths = [
        Constraint::Percentage(20),
        Constraint::Percentage(20),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(10),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["zone", "key", "rate", "req/s", "passed/s", "delayed/s", "rejected/s"]).style(bold))
            .block(Block::default().borders(Borders::ALL).title(format!("zones (decisions, {})", top.scope.decisions))),
        zones_area,
    );

    if adaptive > 0 {
        let rows = top.adaptive().map(|(name, a)| {
            Row::new(vec![
                printable(name),
                a.limit.to_string(),
                a.in_flight.to_string(),
                a.waiting.to_string(),
                a.ideal_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1}")),
                a.shed.to_string(),
            ])
        });
        let widths = [
            Constraint::Percentage(25),
            Constraint::Length(7),
            Constraint::Length(10),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Length(10),
        ];
        frame.render_widget(
            Table::new(rows, widths)
                .header(Row::new(["upstream", "limit", "in flight", "waiting", "ideal ms", "shed"]).style(bold))
                .block(Block::default().borders(Borders::ALL).title("adaptive concurrency (this instance)")),
            adaptive_area,
        );
    }

    let keys = app.keys();
    let rows = keys.iter().map(|(zone, k)| {
        Row::new(vec![
            zone.clone(),
            printable(&k.key),
            rate(k.rate),
            rate(k.rejected_rate),
            rate(k.delayed_rate),
            // A leased key: what the instance holds ("L37"), its fill being Redis's to know.
            k.lease_held.map_or_else(|| format!("{:.0}%", k.fill * 100.0), |held| format!("L{held}")),
            k.instances.to_string(),
        ])
    });
    let widths = [
        Constraint::Percentage(15),
        Constraint::Percentage(35),
        Constraint::Length(9),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Length(9),
    ];
    let mut state = TableState::default().with_selected((!keys.is_empty()).then_some(app.selected));
    frame.render_stateful_widget(
        Table::new(rows, widths)
            .header(Row::new(["zone", "key", "req/s", "rejected/s", "delayed/s", "fill", "instances"]).style(bold))
            .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
            .highlight_symbol("> ")
            .block(Block::default().borders(Borders::ALL).title(format!(
                "top keys ({}), by {}",
                top.scope.keys,
                app.sort.name()
            ))),
        keys_area,
        &mut state,
    );

    let text = match (&app.confirm, &app.message) {
        (Some((zone, _, key)), _) => {
            format!("Reset {} in zone {zone}? y to confirm, any other key cancels", printable(key))
        }
        (None, Some(message)) => printable(message),
        (None, None) => "q quit  s sort  ↑/↓ select  r reset key".to_string(),
    };
    frame.render_widget(Paragraph::new(Line::from(text)), footer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(printable("203.0.113.7"), "203.0.113.7");
        assert_eq!(printable("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
    }
}
