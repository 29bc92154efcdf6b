//! `[tracing]`: OpenTelemetry traces over OTLP/HTTP (src/trace/). Absent: no tracing at all.

use std::time::Duration;

use super::checks::parse_duration;
use super::error::{ConfigError, Source};
use super::schema;
use super::spanned::Spanned;

/// The longest `tracing.timeout`: an export that takes longer is lost anyway, and the exporter's
/// queue fills behind it.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Where and how much to trace. Read at start: a change applies at the next restart.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The OTLP/HTTP traces URL, e.g. `http://otel-collector:4318/v1/traces`.
    pub endpoint: String,
    /// Share of the traces started here that are recorded (0.0-1.0); a sampled incoming
    /// `traceparent` is always followed.
    pub sample_ratio: f64,
    pub service_name: String,
    /// Time one export may take.
    pub timeout: Duration,
}

pub(super) fn compile_tracing(
    src: &Source<'_>,
    tracing: Option<Spanned<schema::Tracing>>,
) -> Result<Option<TraceSettings>, ConfigError> {
    let Some(tracing) = tracing else { return Ok(None) };
    let schema::Tracing { endpoint, sample_ratio, service_name, timeout } = tracing.into_inner();
    let url = endpoint.get_ref();
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() <= "https://".len() {
        return Err(src.error_at(
            &endpoint.span(),
            format!("tracing.endpoint: expected an http:// or https:// URL like \"http://127.0.0.1:4318/v1/traces\", got {url:?}"),
        ));
    }
    let sample_ratio = match sample_ratio {
        None => 1.0,
        Some(r) if (0.0..=1.0).contains(r.get_ref()) => *r.get_ref(),
        Some(r) => {
            return Err(src.error_at(&r.span(), format!("tracing.sample_ratio: must be 0.0..=1.0, got {}", r.get_ref())))
        }
    };
    let timeout = match timeout {
        None => Duration::from_secs(10),
        Some(t) => parse_duration(t.get_ref()).filter(|d| !d.is_zero() && *d <= MAX_TIMEOUT).ok_or_else(|| {
            src.error_at(
                &t.span(),
                format!(
                    "tracing.timeout: expected a duration from \"1ms\" to \"60s\" like \"10s\", got {:?}",
                    t.get_ref()
                ),
            )
        })?,
    };
    Ok(Some(TraceSettings {
        endpoint: endpoint.into_inner(),
        sample_ratio,
        service_name: service_name.map_or_else(|| "weir".to_string(), |s| s.into_inner()),
        timeout,
    }))
}
