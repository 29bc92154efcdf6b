//! Writing Weir's own responses (404, 429, …) with custom headers. A rejection is a decision, not an
//! error, so it is written here rather than through Pingora's error path (which cannot carry
//! `Retry-After`).

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::Session;
use pingora::ErrorSource;

use crate::engine::Answer;

/// Writes a complete JSON response. Returns `Ok(true)`: "already responded" for `request_filter`.
pub async fn json(
    session: &mut Session,
    status: u16,
    headers: &[(&'static str, String)],
    body: String,
) -> Result<bool> {
    with_body(session, status, headers, "application/json", body).await
}

/// Writes a complete response with this body and content type.
async fn with_body(
    session: &mut Session,
    status: u16,
    headers: &[(&'static str, String)],
    content_type: &str,
    body: String,
) -> Result<bool> {
    let mut resp = own_response(session, status, headers, 2)?;
    resp.insert_header("Content-Type", content_type)?;
    resp.insert_header("Content-Length", body.len().to_string())?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(Bytes::from(body)), true).await?;
    Ok(true)
}

/// The head of one of Weir's own responses with `headers`, room for `extra` more. Unread request
/// bodies are drained before a keepalive connection is reused: that work is bounded, so a client
/// cannot tie up the proxy with a huge body it knows will be refused.
fn own_response(
    session: &mut Session,
    status: u16,
    headers: &[(&'static str, String)],
    extra: usize,
) -> Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(status, Some(headers.len() + extra))?;
    for (name, value) in headers {
        resp.insert_header(*name, value.as_str())?;
    }
    session.set_total_drain_timeout(Some(std::time::Duration::from_secs(1)));
    Ok(resp)
}

/// One of Weir's own answers. A gRPC request (`content-type: application/grpc*`) gets a gRPC
/// answer when the answer has a gRPC status (a limit's refusal on a route with `grpc_status`):
/// gRPC libraries turn an HTTP 429 or 503 into a confusing UNAVAILABLE/UNKNOWN, while
/// `grpc-status: 8` reads as RESOURCE_EXHAUSTED with its message.
pub async fn answer(session: &mut Session, answer: &Answer<'_>) -> Result<bool> {
    if answer.status == CLOSE_STATUS {
        return Err(close_without_response());
    }
    match answer.grpc_status.filter(|_| is_grpc(session.req_header())) {
        Some(code) => grpc(session, code, &answer.headers, &answer.refusal.grpc_message()).await,
        None => match answer.refusal.own_body() {
            // The route's own rejection body (`rejection_body`).
            Some(own) => with_body(session, answer.status, &answer.headers, &own.content_type, own.body.clone()).await,
            None => json(session, answer.status, &answer.headers, answer.refusal.body()).await,
        },
    }
}

/// nginx's 444 (a `limit_req_status` / `limit_conn_status`): no response at all, the connection
/// (or HTTP/2 stream) is closed. Only the limits' statuses can be 444: they are the only
/// configurable ones.
pub const CLOSE_STATUS: u16 = 444;

const CLOSED_444: &str = "closed_444";

/// The error that makes Pingora close the client connection without writing anything
/// (`fail_to_proxy` answers it with no response, as it does a client that left).
fn close_without_response() -> Box<Error> {
    Error::create(
        ErrorType::Custom(CLOSED_444),
        ErrorSource::Downstream,
        Some("status 444: closed without a response".into()),
        None,
    )
}

/// Whether `e` is the 444 close, which is Weir's decision and not the client leaving.
pub fn is_close_444(e: &Error) -> bool {
    matches!(e.etype(), ErrorType::Custom(CLOSED_444))
}

/// `content-type: application/grpc`, `application/grpc+proto`, `application/grpc-web`, …
pub fn is_grpc(req: &RequestHeader) -> bool {
    req.headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().len() >= 16 && v.as_bytes()[..16].eq_ignore_ascii_case(b"application/grpc"))
}

/// A trailers-only gRPC response: HTTP 200, `grpc-status` and `grpc-message` in the only
/// HEADERS frame, no body; the rate-limit fields ride along.
pub async fn grpc(session: &mut Session, code: u8, headers: &[(&'static str, String)], message: &str) -> Result<bool> {
    let mut resp = own_response(session, 200, headers, 4)?;
    resp.insert_header("content-type", "application/grpc")?;
    resp.insert_header("grpc-status", code.to_string())?;
    resp.insert_header("grpc-message", encode_grpc_message(message))?;
    // HTTP/2: one HEADERS frame with END_STREAM. Pingora's proxy session would follow the header
    // with an empty DATA frame, and gRPC clients read `grpc-status` only from a frame that ends
    // the stream (they report "Stream removed"/UNKNOWN otherwise).
    if let pingora::protocols::http::ServerSession::H2(h2) = session.as_downstream_mut() {
        h2.write_response_header(Box::new(resp), true)?;
        return Ok(true);
    }
    // gRPC-Web and other HTTP/1.1 clients need the end of the (empty) body marked.
    resp.insert_header("Content-Length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

/// gRPC's percent-encoding of `grpc-message`: bytes outside printable ASCII, and `%`.
fn encode_grpc_message(message: &str) -> String {
    const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_encoded() {
        assert_eq!(encode_grpc_message("50% é\n"), "50%25 %C3%A9%0A");
    }

    #[test]
    fn grpc_content_types() {
        let mut req = RequestHeader::build("POST", b"/svc/Method", None).unwrap();
        assert!(!is_grpc(&req));
        for ct in ["application/grpc", "application/grpc+proto", "Application/GRPC-web"] {
            req.insert_header("content-type", ct).unwrap();
            assert!(is_grpc(&req), "{ct}");
        }
        req.insert_header("content-type", "application/json").unwrap();
        assert!(!is_grpc(&req));
    }
}
