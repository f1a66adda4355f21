//! The HTTP client: one Bot API call in, a parsed result or a classified error out.
//! The token is part of every URL, so every error text is scrubbed of it.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::api::ApiResponse;

/// Why a call failed, sorted by what the caller may do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// No answer came. `sent` says whether the request may have reached the API (a
    /// timeout or a reset after sending): a `sendMessage` is then not retried, since
    /// Telegram has no idempotency key and a retry could post the message twice.
    Network { sent: bool, text: String },
    /// The API answered with an error code.
    Api {
        code: u16,
        description: String,
        /// From `parameters.retry_after` (with 429).
        retry_after: Option<Duration>,
    },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Network { text, .. } => write!(f, "network: {text}"),
            CallError::Api {
                code, description, ..
            } => write!(f, "{code}: {description}"),
        }
    }
}

/// A Bot API client: an HTTP agent (connections kept alive) and the method base URL.
pub(crate) struct Client {
    agent: ureq::Agent,
    /// `{api_url}/bot{token}`: secret, never logged.
    base: String,
    /// To scrub from error texts.
    token: String,
    /// Connect timeout; the request timeout is given per call.
    connect: Duration,
}

impl Client {
    pub(crate) fn new(api_url: &str, token: &str, connect: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            // Error statuses come back as answers: their JSON says why.
            .http_status_as_error(false)
            .timeout_connect(Some(connect))
            .user_agent("botmesh")
            .build();
        Client {
            agent: ureq::Agent::new_with_config(config),
            base: format!("{}/bot{token}", api_url.trim_end_matches('/')),
            token: token.to_owned(),
            connect,
        }
    }

    fn scrub(&self, text: String) -> String {
        if self.token.is_empty() {
            text
        } else {
            text.replace(&self.token, "<token>")
        }
    }

    /// Calls `method` with a JSON body; `timeout` bounds the whole exchange.
    pub(crate) fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let url = format!("{}/{method}", self.base);
        let bytes = serde_json::to_vec(body).map_err(|e| CallError::Network {
            sent: false,
            text: format!("cannot encode the request: {e}"),
        })?;
        let sent = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(timeout + self.connect))
            .build()
            .content_type("application/json")
            .send(&bytes[..]);
        let mut response = sent.map_err(|e| CallError::Network {
            sent: may_have_been_sent(&e),
            text: self.scrub(e.to_string()),
        })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(50 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| CallError::Network {
                sent: true,
                text: self.scrub(e.to_string()),
            })?;
        match serde_json::from_str::<ApiResponse<T>>(&text) {
            Ok(r) if r.ok => r.result.ok_or_else(|| CallError::Api {
                code: status,
                description: "ok without a result".into(),
                retry_after: None,
            }),
            Ok(r) => Err(CallError::Api {
                code: r.error_code.unwrap_or(status),
                description: r.description.unwrap_or_default(),
                retry_after: r
                    .parameters
                    .and_then(|p| p.retry_after)
                    .map(Duration::from_secs),
            }),
            Err(e) => Err(CallError::Api {
                // A proxy's error page, or an answer of another shape.
                code: if status < 400 { 502 } else { status },
                description: format!("the answer does not parse: {e}"),
                retry_after: None,
            }),
        }
    }
}

/// Whether a failed request may have reached the API: only failures before the
/// connection was up are known not to have.
fn may_have_been_sent(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => false,
        ureq::Error::Timeout(t) => !matches!(
            t,
            ureq::Timeout::Connect | ureq::Timeout::Resolve | ureq::Timeout::SendRequest
        ),
        ureq::Error::Io(io) => !matches!(
            io.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::NotFound | ErrorKind::AddrNotAvailable
        ),
        _ => true,
    }
}
