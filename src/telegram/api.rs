//! The Bot API's shapes this transport reads and writes (serde derive), and the pure
//! mappings between them and the crate's [`Message`] and [`Keyboard`].
//!
//! Only the fields the transport uses are declared; serde skips the others, so new
//! fields the Bot API adds do not break parsing. Reference: <https://core.telegram.org/bots/api>.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::message::Message;
use crate::provider::{ButtonAction, Keyboard, Reply};

/// The envelope of every Bot API answer.
#[derive(Debug, Deserialize)]
pub(crate) struct ApiResponse<T> {
    pub(crate) ok: bool,
    pub(crate) result: Option<T>,
    pub(crate) description: Option<String>,
    pub(crate) error_code: Option<u16>,
    pub(crate) parameters: Option<ResponseParameters>,
}

/// Why a request failed, where the API says more than the code.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponseParameters {
    /// Seconds to wait before the next request (with `429 Too Many Requests`).
    pub(crate) retry_after: Option<u64>,
}

/// One incoming update: what `getUpdates` returns and a webhook receives. Handlers
/// find it as the message's payload: `ctx.message().payload::<Update>()`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Update {
    /// The update's number: increasing, and the offset `getUpdates` confirms.
    pub update_id: i64,
    /// A new message in a private chat or group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessage>,
    /// A new post in a channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_post: Option<ChatMessage>,
    /// A press of an inline keyboard button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_query: Option<CallbackQuery>,
}

/// A message as the Bot API describes it (the fields this transport reads).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChatMessage {
    /// The message's id within its chat.
    pub message_id: i64,
    /// The chat it was sent in.
    pub chat: Chat,
    /// The sender; absent in channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<User>,
    /// When it was sent, Unix time in seconds.
    #[serde(default)]
    pub date: i64,
    /// The text of a text message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The caption of a photo, video or document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
}

/// A chat.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Chat {
    /// The chat's id (negative for groups and channels): the bot's chat id, as text.
    pub id: i64,
    /// `private`, `group`, `supergroup` or `channel`.
    #[serde(rename = "type", default)]
    pub kind: String,
}

/// A Telegram user or bot.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct User {
    /// The user's id.
    pub id: i64,
    /// Whether it is a bot.
    #[serde(default)]
    pub is_bot: bool,
    /// The first name.
    #[serde(default)]
    pub first_name: String,
    /// The username, without `@`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
}

/// A press of an inline keyboard button.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallbackQuery {
    /// The query's id (for `answerCallbackQuery`).
    pub id: String,
    /// Who pressed.
    pub from: User,
    /// The message the button was on (absent when too old).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessage>,
    /// The button's callback data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// The message an update brings to the bot, or `None` for an update with no chat to
/// answer (an inline query, a poll, an edited message: not handled by this transport).
///
/// The message's chat is the chat id as text, its id the update id (unique, and the
/// same on every retry of a webhook, so the dedup window answers a retry once), its
/// text the message's text or caption (empty for a sticker or a photo without one), or
/// the pressed button's callback data; its payload is the [`Update`].
pub fn to_message(update: &Update) -> Option<Message> {
    let (chat, text) = if let Some(m) = update.message.as_ref().or(update.channel_post.as_ref()) {
        let text = m.text.as_deref().or(m.caption.as_deref()).unwrap_or("");
        (m.chat.id, text)
    } else if let Some(q) = &update.callback_query {
        (q.message.as_ref()?.chat.id, q.data.as_deref().unwrap_or(""))
    } else {
        return None;
    };
    Some(
        Message::new(chat.to_string(), text)
            .with_id(update.update_id.to_string())
            .with_payload(update.clone()),
    )
}

/// The `reply_markup` field of `sendMessage` for `keyboard`.
pub(crate) fn markup(keyboard: &Keyboard) -> Value {
    match keyboard {
        Keyboard::Inline(rows) => {
            let rows: Vec<Vec<Value>> = rows
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|b| match &b.action {
                            ButtonAction::Callback(data) => {
                                json!({"text": b.text, "callback_data": data})
                            }
                            ButtonAction::Url(url) => json!({"text": b.text, "url": url}),
                        })
                        .collect()
                })
                .collect();
            json!({ "inline_keyboard": rows })
        }
        Keyboard::Reply {
            rows,
            one_time,
            resize,
        } => {
            let rows: Vec<Vec<Value>> = rows
                .iter()
                .map(|row| row.iter().map(|t| json!({ "text": t })).collect())
                .collect();
            json!({
                "keyboard": rows,
                "one_time_keyboard": one_time,
                "resize_keyboard": resize,
            })
        }
        Keyboard::Remove => json!({ "remove_keyboard": true }),
    }
}

/// The body of `sendMessage`: a numeric chat id goes as a number, anything else
/// (`@channelname`) as a string.
pub(crate) fn send_message_body(chat: &str, reply: &Reply) -> Value {
    let chat_id = match chat.parse::<i64>() {
        Ok(id) => json!(id),
        Err(_) => json!(chat),
    };
    let mut body = json!({ "chat_id": chat_id, "text": reply.text });
    if let (Some(k), Some(map)) = (&reply.keyboard, body.as_object_mut()) {
        map.insert("reply_markup".to_owned(), markup(k));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InlineButton;

    fn update(json: &str) -> Update {
        serde_json::from_str(json).expect("parses")
    }

    #[test]
    fn messages_captions_and_button_presses_map_to_messages() {
        let u = update(
            r#"{"update_id": 7, "message": {"message_id": 1, "date": 0,
                "chat": {"id": -100, "type": "group"}, "text": "hi", "extra": [1]}}"#,
        );
        let m = to_message(&u).expect("a message");
        assert_eq!((m.chat.as_str(), m.text.as_str()), ("-100", "hi"));
        assert_eq!(m.id.as_deref(), Some("7"));
        assert_eq!(m.payload::<Update>(), Some(&u));
        let u = update(
            r#"{"update_id": 8, "message": {"message_id": 2, "chat": {"id": 5}, "caption": "c"}}"#,
        );
        assert_eq!(to_message(&u).map(|m| m.text), Some("c".to_owned()));
        let u = update(
            r#"{"update_id": 9, "callback_query": {"id": "q", "from": {"id": 5},
                "data": "yes", "message": {"message_id": 3, "chat": {"id": 5}}}}"#,
        );
        assert_eq!(to_message(&u).map(|m| m.text), Some("yes".to_owned()));
        assert!(to_message(&update(r#"{"update_id": 10, "poll": {}}"#)).is_none());
    }

    #[test]
    fn keyboards_map_to_reply_markup() {
        let inline = Reply::new("pick").with_keyboard(Keyboard::Inline(vec![vec![
            InlineButton::callback("Yes", "y"),
            InlineButton::url("Docs", "https://example.org"),
        ]]));
        let body = send_message_body("42", &inline);
        assert_eq!(body["chat_id"], json!(42));
        assert_eq!(
            body["reply_markup"]["inline_keyboard"][0][1],
            json!({"text": "Docs", "url": "https://example.org"})
        );
        let reply = Reply::new("pick").with_keyboard(Keyboard::reply([["a", "b"], ["c", "d"]]));
        let body = send_message_body("@chan", &reply);
        assert_eq!(body["chat_id"], json!("@chan"));
        assert_eq!(body["reply_markup"]["keyboard"][1][0], json!({"text": "c"}));
        assert_eq!(body["reply_markup"]["resize_keyboard"], json!(true));
        assert!(
            send_message_body("1", &Reply::new("x"))
                .get("reply_markup")
                .is_none()
        );
    }
}
