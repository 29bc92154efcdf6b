//! Writing Weir's own responses (404, 429, …) with custom headers. A rejection is a decision, not an
//! error, so it is written here rather than through Pingora's error path (which cannot carry
//! `Retry-After`).

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;

/// Writes a complete JSON response. Returns `Ok(true)`: "already responded" for `request_filter`.
pub async fn json(
    session: &mut Session,
    status: u16,
    headers: &[(&'static str, String)],
    body: String,
) -> Result<bool> {
    let mut resp = ResponseHeader::build(status, Some(headers.len() + 2))?;
    for (name, value) in headers {
        resp.insert_header(*name, value.as_str())?;
    }
    resp.insert_header("Content-Type", "application/json")?;
    resp.insert_header("Content-Length", body.len().to_string())?;
    // Unread request bodies are drained before a keepalive connection is reused: bound that work
    // so a client cannot tie up the proxy with a huge body it knows will be refused.
    session.set_total_drain_timeout(Some(std::time::Duration::from_secs(1)));
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(Bytes::from(body)), true).await?;
    Ok(true)
}
