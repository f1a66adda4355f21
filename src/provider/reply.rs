//! What a reply carries beyond its text (keyboards), and the fence a send is made
//! under: the check that the turn (and, in leader mode, the leadership) it speaks
//! for is still held, asked again before every attempt of a retried send.

use std::fmt;

use crate::coordinator::Token;

/// A reply: a text, and optionally a keyboard the platform shows with it.
///
/// Converts from `&str` and `String`, so every place that takes a text takes a
/// `Reply` too ([`Flow::answer`](crate::Flow::answer), [`Flow::ask`](crate::Flow::ask)).
///
/// ```
/// use botmesh::{InlineButton, Keyboard, Reply};
///
/// let reply = Reply::new("Confirm the order?").with_keyboard(Keyboard::Inline(vec![vec![
///     InlineButton::callback("Yes", "yes"),
///     InlineButton::callback("No", "no"),
/// ]]));
/// assert_eq!(reply.text, "Confirm the order?");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The text to send.
    pub text: String,
    /// The keyboard to show with it, if any. A transport without keyboards sends the
    /// text alone (see [`Provider::send_reply`](crate::Provider::send_reply)).
    pub keyboard: Option<Keyboard>,
}

impl Reply {
    /// A reply with `text` and no keyboard.
    pub fn new(text: impl Into<String>) -> Self {
        Reply {
            text: text.into(),
            keyboard: None,
        }
    }

    /// Adds (or replaces) the keyboard.
    #[must_use]
    pub fn with_keyboard(mut self, keyboard: Keyboard) -> Self {
        self.keyboard = Some(keyboard);
        self
    }
}

impl From<&str> for Reply {
    fn from(text: &str) -> Self {
        Reply::new(text)
    }
}

impl From<String> for Reply {
    fn from(text: String) -> Self {
        Reply::new(text)
    }
}

impl From<&String> for Reply {
    fn from(text: &String) -> Self {
        Reply::new(text.as_str())
    }
}

/// A keyboard shown with a reply, in the two kinds chat platforms have (Telegram's
/// `InlineKeyboardMarkup` and `ReplyKeyboardMarkup`, WhatsApp's buttons and lists).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Keyboard {
    /// Buttons under the message, in rows. A press comes back as a message whose
    /// text is the button's callback data (Telegram: a `callback_query`).
    Inline(Vec<Vec<InlineButton>>),
    /// Buttons in place of the user's keyboard, in rows of button texts; a press
    /// sends the button's text as an ordinary message.
    Reply {
        /// The button texts, row by row.
        rows: Vec<Vec<String>>,
        /// Hide the keyboard once a button was pressed.
        one_time: bool,
        /// Let the platform size the buttons to their texts.
        resize: bool,
    },
    /// Removes a reply keyboard shown earlier.
    Remove,
}

impl Keyboard {
    /// A reply keyboard with these rows, resized to fit, kept after a press.
    pub fn reply<R, S>(rows: R) -> Self
    where
        R: IntoIterator,
        R::Item: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Keyboard::Reply {
            rows: rows
                .into_iter()
                .map(|r| r.into_iter().map(Into::into).collect())
                .collect(),
            one_time: false,
            resize: true,
        }
    }
}

/// One button of an inline keyboard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlineButton {
    /// The label.
    pub text: String,
    /// What pressing it does.
    pub action: ButtonAction,
}

/// What pressing an inline button does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ButtonAction {
    /// Sends this data back to the bot (Telegram allows 1–64 bytes).
    Callback(String),
    /// Opens this URL.
    Url(String),
}

impl InlineButton {
    /// A button that sends `data` back to the bot when pressed.
    pub fn callback(text: impl Into<String>, data: impl Into<String>) -> Self {
        InlineButton {
            text: text.into(),
            action: ButtonAction::Callback(data.into()),
        }
    }

    /// A button that opens `url`.
    pub fn url(text: impl Into<String>, url: impl Into<String>) -> Self {
        InlineButton {
            text: text.into(),
            action: ButtonAction::Url(url.into()),
        }
    }
}

/// The fence a send is made under: whether the turn (and, for a leader-mode provider,
/// the leadership) it speaks for is still held. A transport that retries a send asks
/// [`Fence::is_live`] before every attempt and gives up, without retrying, once it
/// reads false: a deposed holder must not speak for the chat (fencing: Kleppmann,
/// "How to do distributed locking", 2016).
pub struct Fence<'a> {
    /// Asked before every attempt.
    live: &'a dyn Fn() -> bool,
    /// The turn's fencing token, for a platform or proxy that can check it.
    token: Option<Token>,
}

impl fmt::Debug for Fence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("live", &(self.live)())
            .field("token", &self.token)
            .finish()
    }
}

/// The fence of a send that speaks for nothing (always live).
fn always() -> bool {
    true
}

impl<'a> Fence<'a> {
    /// A fence that asks `live` before every attempt, with the turn's `token`.
    pub fn new(live: &'a dyn Fn() -> bool, token: Option<Token>) -> Self {
        Fence { live, token }
    }

    /// A fence that is always live: for sends outside any turn (a test, a broadcast).
    pub fn none() -> Fence<'static> {
        Fence {
            live: &always,
            token: None,
        }
    }

    /// Whether the send may still go out. False once the turn's lease was lost (or,
    /// for flows, the step was stopped), or the leadership was lost.
    pub fn is_live(&self) -> bool {
        (self.live)()
    }

    /// The fencing token of the turn the send is made under, if any.
    pub fn token(&self) -> Option<Token> {
        self.token
    }

    /// This fence, narrowed by a second condition (both must hold).
    pub(crate) fn and<'b>(&'b self, also: &'b dyn Fn() -> bool) -> impl Fn() -> bool + 'b {
        move || self.is_live() && also()
    }
}
