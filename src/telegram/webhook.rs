//! The webhook endpoint's logic: a request's secret header and body in, the HTTP
//! status to answer out. Serving HTTP is the caller's (see `examples/telegram_echo.rs`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::api::{Update, to_message};
use crate::config::ConfigError;
use crate::intake::Intake;
use crate::replica::Accepted;

/// The header Telegram sends the webhook's secret in.
pub const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";

/// A Telegram webhook endpoint for one replica: give it each request's
/// [`SECRET_HEADER`] value and body, answer what [`Webhook::handle`] returns. Run one on
/// every replica behind the load balancer: a retry of an update that reaches another
/// replica is answered once (the update id is the message id, and the dedup window
/// covers every replica).
///
/// ```
/// use botmesh::{Bot, Message};
/// use botmesh::telegram::Webhook;
///
/// let bot = Bot::builder().handler(|_| Ok(())).build()?;
/// let hook = Webhook::new(bot.intake(), "s3cret")?;
/// let body = br#"{"update_id": 1, "message": {"message_id": 1, "chat": {"id": 42}, "text": "hi"}}"#;
/// assert_eq!(hook.handle(Some("s3cret"), body), 200);
/// assert_eq!(hook.handle(Some("guess"), body), 403);
/// assert_eq!(hook.handle(Some("s3cret"), b"{not json"), 400);
/// bot.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Webhook {
    intake: Intake,
    /// What `setWebhook` was given as `secret_token`; `None` accepts any request.
    secret: Option<String>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("intake", &self.intake)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Webhook {
    /// An endpoint feeding `intake` that refuses requests without `secret` (the
    /// `secret_token` given to `setWebhook`: 1–256 of `A-Z a-z 0-9 _ -`).
    ///
    /// # Errors
    /// [`ConfigError`] naming `secret` when it is empty, too long or has another
    /// character (the value itself is not shown).
    pub fn new(intake: Intake, secret: impl Into<String>) -> Result<Self, ConfigError> {
        let secret = secret.into();
        let fine = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if secret.is_empty() || secret.len() > 256 || !secret.chars().all(fine) {
            return Err(ConfigError::new(format!(
                "secret: a value of {} characters is refused; Telegram takes 1 to 256 of \
                 A-Z, a-z, 0-9, _ and -",
                secret.chars().count()
            )));
        }
        Ok(Webhook {
            intake,
            secret: Some(secret),
        })
    }

    /// An endpoint that accepts any request: only behind something else that checks
    /// the sender.
    pub fn without_secret(intake: Intake) -> Self {
        Webhook {
            intake,
            secret: None,
        }
    }

    /// Handles one request: `secret` is the [`SECRET_HEADER`] value (`None` when
    /// absent), `body` the request body. Returns the HTTP status to answer:
    ///
    /// - `200` once the update holds its place in its chat's queue (or was handled
    ///   already: a retry), or when it has no chat to answer (skipped; answering an
    ///   error would only make Telegram send it again);
    /// - `401` without the header, `403` with a wrong one (logged, without values);
    /// - `400` when the body is not an update (logged with the parse error);
    /// - `503` when the intake did not take it (coordinator unreachable, bot
    ///   stopping): Telegram sends it again later, to this or another replica;
    /// - `500` if anything panicked (logged); never panics itself.
    pub fn handle(&self, secret: Option<&str>, body: &[u8]) -> u16 {
        catch_unwind(AssertUnwindSafe(|| self.handle_inner(secret, body))).unwrap_or_else(|_| {
            log::error!(target: "botmesh::telegram", "the webhook handler panicked");
            500
        })
    }

    fn handle_inner(&self, secret: Option<&str>, body: &[u8]) -> u16 {
        if let Some(expected) = &self.secret {
            match secret {
                None => {
                    log::warn!(target: "botmesh::telegram", "webhook request without {SECRET_HEADER} refused");
                    return 401;
                }
                Some(got) if !same(got.as_bytes(), expected.as_bytes()) => {
                    log::warn!(target: "botmesh::telegram", "webhook request with a wrong {SECRET_HEADER} refused");
                    return 403;
                }
                Some(_) => {}
            }
        }
        let update: Update = match serde_json::from_slice(body) {
            Ok(u) => u,
            Err(e) => {
                log::warn!(target: "botmesh::telegram", "webhook body of {} bytes is not an update: {e}", body.len());
                return 400;
            }
        };
        let Some(message) = to_message(&update) else {
            log::debug!(target: "botmesh::telegram", "update {} has no chat to answer; skipped", update.update_id);
            return 200;
        };
        match self.intake.deliver(message) {
            Ok(Accepted::Queued | Accepted::Duplicate) => 200,
            Err(e) => {
                log::warn!(target: "botmesh::telegram", "update {} not taken in, answering 503: {e}", update.update_id);
                503
            }
        }
    }
}

/// Compares in time independent of where the inputs differ (a secret check).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
