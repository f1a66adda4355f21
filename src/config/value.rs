//! Values as the input wrote them, and how messages show them.
//!
//! serde's own type errors ("invalid type: boolean `true`, expected ...") name neither
//! the field nor, for arrays and maps, the value. Every setting reads through [`read`]
//! instead, which hands it any value but a map as a [`Raw`], so that it can refuse a
//! value of the wrong kind in one sentence of its own. The refusal is raised inside the
//! format's reading of the value, where the format adds the value's line and column.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// One value as written, before its setting checks it.
pub(super) enum Raw {
    Str(String),
    /// A whole number that is not negative.
    Whole(u64),
    Negative(i64),
    Float(f64),
    /// A kind no scalar setting takes: the value as shown, and what it is.
    Other(String, &'static str),
}

impl Raw {
    /// The value as messages show it, and its kind (`"is a string"`).
    pub(super) fn shown(&self) -> (String, &'static str) {
        match self {
            Raw::Str(s) => (quote(s), "is a string"),
            Raw::Whole(n) => (n.to_string(), "is a number"),
            Raw::Negative(n) => (n.to_string(), "is a number"),
            Raw::Float(v) if *v != 0.0 && !(1e-6..1e16).contains(&v.abs()) => {
                (format!("{v:e}"), "is a number")
            }
            // `{:?}` keeps the point of a whole float (`100000.0`), so a message about
            // a whole number does not seem to refuse one.
            Raw::Float(v) => (format!("{v:?}"), "is a number"),
            Raw::Other(shown, kind) => (shown.clone(), kind),
        }
    }

    /// The message for a value of the wrong kind. With `hide` the value is not shown:
    /// it may be a URL that holds a password.
    pub(super) fn wrong(&self, name: &str, expected: &str, hide: bool) -> String {
        let (shown, kind) = self.shown();
        if hide && shown != "null" {
            format!(
                "{name}: the value {kind} (its text is not shown, as it may hold a password); \
                 expected {expected}"
            )
        } else {
            format!("{name}: {shown} {kind}; expected {expected}")
        }
    }

    fn int(v: i64) -> Raw {
        u64::try_from(v).map_or(Raw::Negative(v), Raw::Whole)
    }
}

/// How one setting reads its value.
pub(super) trait Read<'de>: Sized {
    type Value;

    /// What the setting takes, for the format's own messages.
    fn expected(&self) -> &str;

    /// Reads any value but a map, or says why it is refused.
    fn other(self, raw: Raw) -> Result<Self::Value, String>;

    /// Reads a map; by default refused like any other kind.
    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let shown = match Value::deserialize(MapAccessDeserializer::new(map)) {
            Ok(Value::Object(map)) => match map.get(TOML_DATETIME_KEY) {
                // The `toml` crate passes a date-time through serde as this one-key map.
                Some(Value::String(datetime)) if map.len() == 1 => {
                    Raw::Other(datetime.clone(), "is a date-time")
                }
                _ => Raw::Other(shorten(Value::Object(map).to_string()), "is a map"),
            },
            _ => Raw::Other("{…}".to_owned(), "is a map"),
        };
        self.other(shown).map_err(de::Error::custom)
    }
}

const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// Reads a value with `reader`.
pub(super) fn read<'de, D: Deserializer<'de>, R: Read<'de>>(
    deserializer: D,
    reader: R,
) -> Result<R::Value, D::Error> {
    deserializer.deserialize_any(Visit(reader))
}

/// A [`Read`] for a scalar setting: `expected`, and the check of the value as written.
pub(super) struct Scalar<F>(pub(super) &'static str, pub(super) F);

impl<'de, T, F: FnOnce(Raw) -> Result<T, String>> Read<'de> for Scalar<F> {
    type Value = T;

    fn expected(&self) -> &str {
        self.0
    }

    fn other(self, raw: Raw) -> Result<T, String> {
        (self.1)(raw)
    }
}

struct Visit<R>(R);

impl<R> Visit<R> {
    fn other<'de, E: de::Error>(self, raw: Raw) -> Result<R::Value, E>
    where
        R: Read<'de>,
    {
        self.0.other(raw).map_err(E::custom)
    }
}

impl<'de, R: Read<'de>> Visitor<'de> for Visit<R> {
    type Value = R::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.expected())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<R::Value, A::Error> {
        self.0.map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<R::Value, A::Error> {
        let shown = Value::deserialize(SeqAccessDeserializer::new(seq))
            .map_or_else(|_| "[…]".to_owned(), |v| shorten(v.to_string()));
        self.other(Raw::Other(shown, "is an array"))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<R::Value, E> {
        self.other(Raw::Other(v.to_string(), "is a boolean"))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<R::Value, E> {
        self.other(Raw::int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<R::Value, E> {
        self.other(Raw::Whole(v))
    }

    // Beyond 64 bits a value is far out of range either way; the float path says so.
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<R::Value, E> {
        self.other(i64::try_from(v).map_or(Raw::Float(v as f64), Raw::int))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<R::Value, E> {
        self.other(u64::try_from(v).map_or(Raw::Float(v as f64), Raw::Whole))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<R::Value, E> {
        self.other(Raw::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<R::Value, E> {
        self.other(Raw::Str(v.to_owned()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<R::Value, E> {
        let shown = format!("<{} bytes>", v.len());
        self.other(Raw::Other(shown, "is a byte string"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<R::Value, E> {
        self.other(Raw::Other("null".to_owned(), "is not accepted"))
    }

    fn visit_none<E: de::Error>(self) -> Result<R::Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<R::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<R::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A string as messages show it: quoted, and cut short when long.
pub(super) fn quote(s: &str) -> String {
    shorten(format!("{s:?}"))
}

/// Cuts a rendered value short, so that a huge input is not echoed whole.
fn shorten(s: String) -> String {
    const LIMIT: usize = 60;
    if s.chars().count() <= LIMIT {
        return s;
    }
    s.chars().take(LIMIT - 1).chain(['…']).collect()
}
