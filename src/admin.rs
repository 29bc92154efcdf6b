//! The admin listener (`[server] admin = "127.0.0.1:9901"`, off when absent): `GET /healthz`,
//! `GET /config` (generation, hash and load time of the running config) and `POST /reload`.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;

use crate::reload::{ReloadOutcome, Reloader};

pub struct AdminApp {
    reloader: Arc<Reloader>,
}

impl AdminApp {
    pub fn new(reloader: Arc<Reloader>) -> Self {
        Self { reloader }
    }

    fn handle(&self, method: &Method, path: &str) -> (StatusCode, serde_json::Value) {
        match (method, path) {
            (&Method::GET, "/healthz") => (StatusCode::OK, json!({ "status": "ok" })),
            (&Method::GET, "/config") => (StatusCode::OK, json!(self.reloader.status())),
            (&Method::POST, "/reload") => match self.reloader.reload("admin API") {
                ReloadOutcome::Applied { generation, hash } => (
                    StatusCode::OK,
                    json!({ "result": "applied", "generation": generation, "hash": hash }),
                ),
                ReloadOutcome::Unchanged { generation } => (
                    StatusCode::OK,
                    json!({ "result": "unchanged", "generation": generation }),
                ),
                ReloadOutcome::Refused(error) => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({ "result": "refused", "error": error }),
                ),
            },
            (_, "/healthz" | "/config" | "/reload") => (
                StatusCode::METHOD_NOT_ALLOWED,
                json!({ "error": "method not allowed" }),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                json!({ "error": "not found", "endpoints": ["/healthz", "/config", "/reload"] }),
            ),
        }
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let (status, body) = self.handle(&req.method, req.uri.path());
        let mut body = body.to_string().into_bytes();
        body.push(b'\n');
        let length = body.len();
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(length),
        );
        resp
    }
}
