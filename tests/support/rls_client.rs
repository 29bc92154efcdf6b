//! A client of Weir's rate limit service (the generated tonic client), as Envoy calls it.

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::Channel;
use weir::rls::proto::rate_limit_descriptor::Entry;
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::{RateLimitDescriptor, RateLimitResponse, RateLimitServiceClient};

/// Bound on one call: a hang is an error, never a stuck test.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client on one HTTP/2 connection to the service at `addr`; panics if it cannot connect.
pub async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .timeout(CALL_TIMEOUT)
        .connect_timeout(CALL_TIMEOUT)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the rls at {addr}: {e}"));
    RateLimitServiceClient::new(channel)
}

/// A descriptor of these (key, value) entries, without a hits_addend or limit of its own.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        limit: None,
        hits_addend: None,
    }
}

/// The answer's overall code.
pub fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).expect("a known code")
}
