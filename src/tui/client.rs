//! The admin API as `weir top` uses it: `GET /top` and `DELETE /limits/{zone}?id=ID`, with the
//! bearer token when one is given.

use std::time::Duration;

use serde::Deserialize;

use super::model::Top;

pub struct AdminClient {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// What a reset answered.
#[derive(Debug, Deserialize)]
pub struct ResetReply {
    pub zone: String,
    pub key: String,
    /// Whether the key held state (`None`: the store could not tell, or an older instance).
    #[serde(default)]
    pub existed: Option<bool>,
}

impl AdminClient {
    /// `admin`: `host:port` or `http://host:port`.
    pub fn new(admin: &str, token: Option<String>) -> Self {
        let base =
            if admin.contains("://") { admin.trim_end_matches('/').to_string() } else { format!("http://{admin}") };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(3)))
            .http_status_as_error(false)
            .build()
            .into();
        Self { base, token, agent }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn top(&self, n: usize) -> Result<Top, String> {
        let text = self.call(self.agent.get(format!("{}/top?n={n}", self.base)))?;
        safe_json(&text).map_err(|e| safe_error(format!("{}/top: unexpected reply: {e}", self.base)))
    }

    pub fn reset(&self, zone: &str, id: &str) -> Result<ResetReply, String> {
        let zone = percent_encoding::utf8_percent_encode(zone, percent_encoding::NON_ALPHANUMERIC);
        let id = percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC);
        let text = self.call(self.agent.delete(format!("{}/limits/{zone}?id={id}", self.base)))?;
        safe_json(&text).map_err(|e| safe_error(format!("reset: unexpected reply: {e}")))
    }

    fn call<B>(&self, mut request: ureq::RequestBuilder<B>) -> Result<String, String>
    where
        ureq::RequestBuilder<B>: Callable,
    {
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let mut response = request.call_it().map_err(|e| safe_error(format!("{}: {e}", self.base)))?;
        let status = response.status();
        let text = response.body_mut().read_to_string().map_err(|e| safe_error(format!("{}: {e}", self.base)))?;
        if status == 401 {
            return Err(format!("{}: 401: give the admin token (--token or WEIR_ADMIN_TOKEN)", self.base));
        }
        if !status.is_success() {
            let error = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            return Err(safe_error(format!("{}: {status}: {error}", self.base)));
        }
        Ok(text)
    }
}

/// An error as the terminal (or stderr) may show it: it may quote what the server sent.
fn safe_error(message: String) -> String {
    crate::top::text::escape(&message).into_owned()
}

/// A reply with every string escaped (`top::text`) before anything reads it: whatever answers on
/// the admin address (names, keys, an instance's host name) never writes to the terminal.
fn safe_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_str(text)?;
    crate::top::text::escape_json(&mut value);
    serde_json::from_value(value)
}

/// `call()` of a request without a body (GET and DELETE are both that in ureq).
pub trait Callable {
    fn call_it(self) -> Result<http::Response<ureq::Body>, ureq::Error>;
}

impl Callable for ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    fn call_it(self) -> Result<http::Response<ureq::Body>, ureq::Error> {
        self.call()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever answers on the admin address: names and keys reach the model escaped.
    #[test]
    fn replies_are_escaped_before_they_are_read() {
        let reply = r#"{"instance":"host\u001b]2;x\u0007","store":{"kind":"re\u202edis","ready":true},
            "routes":[{"route":"a\u009bb","zones":["z\u200bz"],"requests":{}}],
            "zones":[{"zone":"z\u001b[2J","key":"k","rate":"1r/s","decisions":{},"rejected":[],
                      "closest":[{"id":"i","key":"\u2066k"}]}]}"#;
        let top: Top = safe_json(reply).expect("parses");
        let texts = [
            top.instance.clone(),
            top.store.kind.clone(),
            top.routes[0].route.clone(),
            top.routes[0].zones[0].clone(),
            top.zones[0].zone.clone(),
            top.zones[0].closest[0].key.clone(),
        ];
        for text in &texts {
            assert!(!text.chars().any(crate::top::text::is_unsafe), "{text:?}");
        }
        assert_eq!(top.instance, "host\\u{1b}]2;x\\u{7}");
        assert_eq!(top.store.kind, "re\\u{202e}dis");
    }
}
