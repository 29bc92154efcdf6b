//! Offered vs admitted requests per zone over time, as a self-contained SVG: one panel per zone,
//! two polylines, axis labels. Hand-written (about a hundred lines) rather than `plotters`: the
//! chart is two lines per panel, and a plotting crate would add a dependency tree and build time
//! to every build of the proxy for it.

use std::fmt::Write as _;

use super::report::dense;
use super::stats::Stats;
use crate::config::Runtime;

const WIDTH: f64 = 900.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn utc(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .map_or_else(|| secs.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

fn polyline(values: &[u64], max: u64, y0: f64, color: &str) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = PANEL - TOP - BOTTOM;
    let n = values.len().max(2) - 1;
    let mut points = String::new();
    for (i, &v) in values.iter().enumerate() {
        let x = LEFT + plot_w * i as f64 / n as f64;
        let y = y0 + TOP + plot_h * (1.0 - v as f64 / max.max(1) as f64);
        let _ = write!(points, "{x:.1},{y:.1} ");
    }
    format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n", points.trim_end())
}

/// The SVG document for `stats` (one panel per zone that saw requests).
pub fn svg(rt: &Runtime, stats: &Stats, title: &str) -> String {
    let panels: Vec<_> = stats
        .series
        .iter()
        .enumerate()
        .filter_map(|(zi, s)| dense(s).map(|d| (rt.zones[zi].name.as_str(), d)))
        .collect();
    let height = PANEL * panels.len().max(1) as f64 + 20.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"16\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for (p, (zone, (first, step, offered, admitted))) in panels.iter().enumerate() {
        let y0 = 20.0 + PANEL * p as f64;
        let max = offered.iter().copied().max().unwrap_or(0);
        let (x1, x2, yb) = (LEFT, WIDTH - RIGHT, y0 + PANEL - BOTTOM);
        let _ = write!(
            out,
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-weight=\"bold\">zone {}: requests per {step} s \
             (<tspan fill=\"#888\">offered</tspan>, <tspan fill=\"#1f77b4\">admitted</tspan>)</text>\n\
             <line x1=\"{x1}\" y1=\"{yb:.1}\" x2=\"{x2}\" y2=\"{yb:.1}\" stroke=\"black\"/>\n\
             <line x1=\"{x1}\" y1=\"{:.1}\" x2=\"{x1}\" y2=\"{yb:.1}\" stroke=\"black\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{max}</text>\n\
             <text x=\"{:.1}\" y=\"{yb:.1}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{x1}\" y=\"{:.1}\">{} UTC</text>\n\
             <text x=\"{x2}\" y=\"{:.1}\" text-anchor=\"end\">{} UTC</text>\n",
            y0 + TOP - 10.0,
            escape(zone),
            y0 + TOP,
            LEFT - 6.0,
            y0 + TOP + 4.0,
            LEFT - 6.0,
            yb + 16.0,
            utc(*first),
            yb + 16.0,
            utc(first + step * offered.len() as u64),
        );
        out.push_str(&polyline(offered, max, y0, "#888"));
        out.push_str(&polyline(admitted, max, y0, "#1f77b4"));
    }
    out.push_str("</svg>\n");
    out
}
