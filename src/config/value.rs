//! A setting's value as the input wrote it, and how messages show it.
//!
//! serde's own type errors ("invalid type: boolean `true`, expected ...") name neither
//! the field nor, for maps and arrays, the value. Reading every scalar setting into a
//! [`Raw`] first lets each setting refuse a value of the wrong kind in one sentence of
//! its own.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// One value as written, before its setting checks it.
pub(super) enum Raw {
    Str(String),
    /// A whole number that is not negative.
    Whole(u64),
    Negative(i64),
    Float(f64),
    /// Any kind no scalar setting accepts: the value as shown, and what it is
    /// (`"is a boolean"`).
    Other(String, &'static str),
}

impl Raw {
    /// The value as messages show it, and its kind as a phrase (`"is a string"`).
    pub(super) fn shown(&self) -> (String, &'static str) {
        match self {
            Raw::Str(s) => (quote(s), "is a string"),
            Raw::Whole(n) => (n.to_string(), "is a number"),
            Raw::Negative(n) => (n.to_string(), "is a number"),
            Raw::Float(v) => (show_f64(*v), "is a number"),
            Raw::Other(shown, kind) => (shown.clone(), kind),
        }
    }

    pub(super) fn int(v: i64) -> Raw {
        u64::try_from(v).map_or(Raw::Negative(v), Raw::Whole)
    }
}

/// The message for a value of the wrong kind: `name: value kind; expected ...`. With
/// `hide` the value is not shown (it may be a URL holding a password).
pub(super) fn wrong_kind(name: &str, raw: &Raw, expected: &str, hide: bool) -> String {
    let (shown, kind) = raw.shown();
    if hide && shown != "null" {
        format!(
            "{name}: the value {kind} (its text is not shown, as it may hold a password); \
             expected {expected}"
        )
    } else {
        format!("{name}: {shown} {kind}; expected {expected}")
    }
}

/// The `Visitor` methods for every kind of value but a map: each hands the value, as a
/// [`Raw`], to `self.$then`, which keeps or refuses it. Shared by the visitors that
/// want a scalar and those that want a map, so that both describe a stray value alike.
/// The caller has `Raw` and `render_seq` in scope.
macro_rules! visit_all_but_maps {
    ($de:lifetime, $then:ident) => {
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            self.$then(Raw::Other(v.to_string(), "is a boolean"))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            self.$then(Raw::int(v))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            self.$then(Raw::Whole(v))
        }
        // Beyond 64 bits a value is far out of range either way; the float path says so.
        fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Self::Value, E> {
            self.$then(i64::try_from(v).map_or(Raw::Float(v as f64), Raw::int))
        }
        fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Self::Value, E> {
            self.$then(u64::try_from(v).map_or(Raw::Float(v as f64), Raw::Whole))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.$then(Raw::Float(v))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            self.$then(Raw::Str(v.to_owned()))
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
            let shown = format!("<{} bytes>", v.len());
            self.$then(Raw::Other(shown, "is a byte string"))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            self.$then(Raw::Other("null".to_owned(), "is not accepted"))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            self.visit_unit()
        }
        fn visit_some<D: serde::Deserializer<$de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_newtype_struct<D: serde::Deserializer<$de>>(
            self,
            d: D,
        ) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<$de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            self.$then(Raw::Other(render_seq(seq), "is an array"))
        }
    };
}
pub(super) use visit_all_but_maps;

/// Reads one scalar setting: `check` turns the value as written into the setting's
/// value, or into the message refusing it. The message is raised inside the format's
/// own reading of the value, so that it points at the value's line and column.
pub(super) fn scalar<'de, D, T, F>(deserializer: D, check: F) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    F: FnOnce(Raw) -> Result<T, String>,
{
    deserializer.deserialize_any(Scalar(check))
}

struct Scalar<F>(F);

impl<F> Scalar<F> {
    fn then<T, E: de::Error>(self, raw: Raw) -> Result<T, E>
    where
        F: FnOnce(Raw) -> Result<T, String>,
    {
        (self.0)(raw).map_err(E::custom)
    }
}

impl<'de, T, F: FnOnce(Raw) -> Result<T, String>> Visitor<'de> for Scalar<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or a number")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        let (shown, kind) = render_map(map);
        self.then(Raw::Other(shown, kind))
    }

    visit_all_but_maps!('de, then);
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
    let mut short: String = s.chars().take(LIMIT - 1).collect();
    short.push('…');
    short
}

/// A float as messages show it: plain unless very large or very small.
fn show_f64(v: f64) -> String {
    if v != 0.0 && !(1e-6..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

pub(super) fn render_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> String {
    let mut items = Vec::new();
    loop {
        match seq.next_element::<serde_json::Value>() {
            Ok(Some(item)) => items.push(item),
            Ok(None) => break,
            Err(_) => return "[…]".to_owned(),
        }
    }
    shorten(serde_json::Value::Array(items).to_string())
}

/// The key under which the `toml` crate passes a date-time through serde.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// A map as messages show it, telling a TOML date-time (which serde sees as a map)
/// apart.
fn render_map<'de, A: MapAccess<'de>>(mut map: A) -> (String, &'static str) {
    let mut entries = serde_json::Map::new();
    loop {
        let key = match map.next_key::<String>() {
            Ok(Some(key)) => key,
            Ok(None) => break,
            Err(_) => return ("{…}".to_owned(), "is a map"),
        };
        if key == TOML_DATETIME_KEY && entries.is_empty() {
            let shown = map.next_value::<String>();
            return (
                shown.unwrap_or_else(|_| "<date-time>".to_owned()),
                "is a date-time",
            );
        }
        match map.next_value::<serde_json::Value>() {
            Ok(value) => entries.insert(key, value),
            Err(_) => return ("{…}".to_owned(), "is a map"),
        };
    }
    let shown = shorten(serde_json::Value::Object(entries).to_string());
    (shown, "is a map")
}
