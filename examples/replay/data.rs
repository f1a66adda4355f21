//! Reading Telegram Bot API `Update` JSON lines into the trace the platform replays.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

/// One line of the input: the part of Telegram's `Update` the replay uses. Other
/// fields (`from`, `edited_message`, …) are ignored.
#[derive(Deserialize)]
struct Update {
    update_id: i64,
    message: Option<TelegramMessage>,
}

#[derive(Deserialize)]
struct TelegramMessage {
    message_id: i64,
    #[serde(default)]
    date: i64,
    chat: TelegramChat,
    text: Option<String>,
}

#[derive(Deserialize)]
struct TelegramChat {
    id: ChatId,
}

/// Telegram gives chat ids as integers; a string is taken as well, since a botmesh
/// chat id is any text.
#[derive(Deserialize)]
#[serde(untagged)]
enum ChatId {
    Number(i64),
    Text(String),
}

/// One text message to replay.
#[derive(Debug)]
pub struct Entry {
    /// The update's `update_id`.
    pub update_id: i64,
    /// Index of its chat in [`Trace::chats`].
    pub chat: usize,
    /// The message's `message_id`: the order the chat's handlers must follow.
    pub message_id: i64,
    /// The original send time, Unix seconds.
    pub date: i64,
    /// The text.
    pub text: String,
}

/// The updates of one input file, in file order.
#[derive(Debug, Default)]
pub struct Trace {
    /// The text messages, in file order.
    pub entries: Vec<Entry>,
    /// Chat ids as botmesh sees them (`"-1005176"`), in order of first appearance.
    pub chats: Vec<String>,
    /// Well-formed lines that hold no text message (edits, joins, stickers…).
    pub skipped: usize,
    /// Lines that are not an `Update` at all, and the first such line number.
    pub malformed: usize,
    /// The 1-based number of the first malformed line.
    pub first_malformed: Option<usize>,
}

/// Reads `path`: one JSON `Update` a line; blank lines are ignored.
///
/// # Errors
/// A message naming the file when it cannot be opened or read.
pub fn load(path: &Path) -> Result<Trace, String> {
    let file =
        File::open(path).map_err(|e| format!("--updates: cannot open {}: {e}", path.display()))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut trace = Trace::default();
    let mut chat_index: HashMap<String, usize> = HashMap::new();
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("--updates: cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let update: Update = match serde_json::from_slice(&line) {
            Ok(u) => u,
            Err(_) => {
                trace.malformed += 1;
                trace.first_malformed.get_or_insert(number);
                continue;
            }
        };
        let Some(message) = update.message else {
            trace.skipped += 1;
            continue;
        };
        let Some(text) = message.text else {
            trace.skipped += 1;
            continue;
        };
        let chat_id = match message.chat.id {
            ChatId::Number(n) => n.to_string(),
            ChatId::Text(s) => s,
        };
        let next = chat_index.len();
        let chat = *chat_index.entry(chat_id).or_insert_with_key(|id| {
            trace.chats.push(id.clone());
            next
        });
        trace.entries.push(Entry {
            update_id: update.update_id,
            chat,
            message_id: message.message_id,
            date: message.date,
            text,
        });
    }
    Ok(trace)
}
