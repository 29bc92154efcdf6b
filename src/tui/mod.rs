//! `weir top`: a live terminal view of an instance's admin API (ratatui + crossterm), refreshed
//! every second: per route and zone the request rates (passed, delayed, rejected), and the keys
//! being limited, fleet-wide on Redis. Keys: `s` sort, ↑/↓ (or j/k) select, `r` reset the
//! selected key (then `y` to confirm, anything else cancels), `q` quit.

pub mod app;
pub mod client;
pub mod model;
mod render;

use std::io;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyEventKind};
use crossterm::execute;
use crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use app::{App, Step};
use client::AdminClient;

/// `weir top`'s options.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The admin address of a Weir instance (`[server] admin`), e.g. 127.0.0.1:9901.
    #[arg(short, long, default_value = "127.0.0.1:9901")]
    pub admin: String,
    /// The admin token (`[server] admin_token`); also read from WEIR_ADMIN_TOKEN.
    #[arg(long, env = "WEIR_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
}

pub fn run(args: TopArgs) -> Result<(), String> {
    let client = AdminClient::new(&args.admin, args.token);
    // Fail before taking the terminal when the address or token is wrong.
    let first = client.top(app::KEYS_PER_ZONE)?;
    let interval = Duration::from_secs_f64(args.interval.clamp(0.1, 60.0));

    enable_raw_mode().map_err(|e| format!("cannot use the terminal: {e}"))?;
    let mut stdout = io::stdout();
    execute!(stdout, EnterAlternateScreen).map_err(|e| format!("cannot use the terminal: {e}"))?;
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout)).map_err(|e| e.to_string())?;
    let result = event_loop(&mut terminal, &client, first, interval);
    // Give the terminal back whatever happened.
    let _ = disable_raw_mode();
    let _ = execute!(terminal.backend_mut(), LeaveAlternateScreen);
    let _ = terminal.show_cursor();
    result
}

fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<io::Stdout>>,
    client: &AdminClient,
    first: model::Top,
    interval: Duration,
) -> Result<(), String> {
    let mut app = App::new(client.base().to_string());
    app.update(Ok(first), Instant::now());
    let mut next_refresh = Instant::now() + interval;
    loop {
        terminal.draw(|frame| render::draw(frame, &app)).map_err(|e| e.to_string())?;
        let wait = next_refresh.saturating_duration_since(Instant::now());
        if event::poll(wait).map_err(|e| e.to_string())? {
            if let Event::Key(key) = event::read().map_err(|e| e.to_string())? {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match app.key(key.code) {
                    Step::Quit => return Ok(()),
                    Step::Reset { zone, id } => {
                        let outcome = client.reset(&zone, &id).map(|r| {
                            let held = if r.existed == Some(false) { " (it held no state)" } else { "" };
                            format!("reset {} in zone {}{held}", r.key, r.zone)
                        });
                        app.reset_done(outcome);
                        next_refresh = Instant::now();
                    }
                    Step::Stay => {}
                }
            }
        }
        if Instant::now() >= next_refresh {
            app.update(client.top(app::KEYS_PER_ZONE), Instant::now());
            next_refresh = Instant::now() + interval;
        }
    }
}
