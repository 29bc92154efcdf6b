//! A connection cap around a Pingora app that has no edge of its own (the admin listener): its
//! share of the descriptor budget (`budget.rs`), so a flood of admin connections can neither take
//! the descriptors the proxy and Redis need nor grow without bound.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;

use super::caps::ConnectionCaps;
use crate::metrics::METRICS;

pub struct Capped<A> {
    app: Arc<A>,
    caps: Arc<ConnectionCaps>,
    max: usize,
    /// `weir_connections_refused_total{cap}` for a connection over `max`.
    label: &'static str,
}

impl<A> Capped<A> {
    pub fn new(app: A, max: usize, label: &'static str) -> Self {
        Self { app: Arc::new(app), caps: Arc::new(ConnectionCaps::default()), max, label }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Capped<A> {
    async fn process_new(self: &Arc<Self>, mut stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        // Held while the app serves the connection (each keep-alive request comes back here).
        let Ok(_permit) = self.caps.admit(None, self.max, None) else {
            METRICS.connections_refused.with_label_values(&[self.label]).inc();
            pingora::protocols::Shutdown::shutdown(&mut *stream).await;
            return None;
        };
        self.app.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.app.cleanup().await
    }
}
