//! Strict reading of the config's maps around serde's derived structs.
//!
//! The derive takes the spellings (`rename_all`, `alias`) and builds the struct, but its
//! errors ("unknown field `x`", "duplicate field `turnWaitMs`") name neither the map nor
//! the spelling the user wrote, and a field's `Deserialize` is never told the key it is
//! read under. [`read`] hands the derived struct a map that checks each key first
//! (unknown, given twice under two spellings, required), and records the key as
//! written, with its path (`coordinator.memory.leaseTtl`), as the setting being read
//! ([`name_or`]), for the value's messages.

use std::cell::RefCell;

use serde::de::value::StrDeserializer;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, Visitor};

use super::value::{self, Raw, quote};

thread_local! {
    /// The setting being read on this thread: serde passes a `Deserialize` no context,
    /// and reading is synchronous.
    static SETTING: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The setting being read, as spelled in the input with its path, or `alone` when a
/// value is read on its own rather than as part of a config.
pub(super) fn name_or(alone: &str) -> String {
    SETTING.with_borrow(|s| s.clone().unwrap_or_else(|| alone.to_owned()))
}

/// Runs `read` with `path` as the setting being read.
pub(super) fn within<R>(path: String, read: impl FnOnce() -> R) -> R {
    /// Puts the outer setting back, also when `read` unwinds.
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SETTING.set(self.0.take());
        }
    }
    let _restore = Restore(SETTING.replace(Some(path)));
    read()
}

/// What one map of the config looks like, for its messages.
pub(super) struct Shape {
    /// Names the map when it is read on its own, not as a setting of a larger map.
    pub(super) alone: &'static str,
    /// What the map looks like, for a value of another kind.
    pub(super) expected: &'static str,
    /// Never show a value of another kind: it may be a URL that holds a password.
    pub(super) hide: bool,
    /// A key that must be given, and the message (after the keys' prefix) without it.
    pub(super) required: Option<(&'static str, &'static str)>,
}

/// Reads `T`, a struct deriving `Deserialize` with `deny_unknown_fields` (which is how
/// an unknown key is told apart), from a map shaped as `shape` says.
pub(super) fn read<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
    inner: D,
    shape: &'static Shape,
) -> Result<T, D::Error> {
    T::deserialize(Strict { inner, shape })
}

struct Strict<D> {
    inner: D,
    shape: &'static Shape,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    /// `fields` names the derive's fields, for the message about an unknown key.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let path = SETTING.with_borrow(Clone::clone);
        let keys = Keys {
            fields,
            shape: self.shape,
            context: path.clone().unwrap_or_else(|| self.shape.alone.to_owned()),
            prefix: path.map(|p| p + ".").unwrap_or_default(),
            seen: Vec::new(),
        };
        value::read(self.inner, Struct { visitor, keys })
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.deserialize_struct("", &[], visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The derive's visitor, and the keys of the map it is about to read.
struct Struct<V> {
    visitor: V,
    keys: Keys,
}

impl<'de, V: Visitor<'de>> value::Read<'de> for Struct<V> {
    type Value = V::Value;

    fn expected(&self) -> &str {
        self.keys.shape.expected
    }

    fn other(self, raw: Raw) -> Result<V::Value, String> {
        let Shape { expected, hide, .. } = *self.keys.shape;
        Err(raw.wrong(&self.keys.context, expected, hide))
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let (keys, current) = (self.keys, String::new());
        self.visitor.visit_map(StrictMap { map, keys, current })
    }
}

/// One map's keys: which are accepted, and which were given.
struct Keys {
    fields: &'static [&'static str],
    shape: &'static Shape,
    /// Names the map in messages.
    context: String,
    /// Goes before each key in messages (`coordinator.memory.`).
    prefix: String,
    /// The field (see [`field_of`]) and the spelling of each key given so far.
    seen: Vec<(String, String)>,
}

impl Keys {
    /// Accepts `key`, which the derive took, unless its field was given already; gives
    /// the key's full name.
    fn admit(&mut self, key: &str) -> Result<String, String> {
        let (field, prefix) = (field_of(key), &self.prefix);
        if let Some((_, earlier)) = self.seen.iter().find(|(f, _)| *f == field) {
            let also = if earlier == key {
                String::new()
            } else {
                format!(" (also as {prefix}{earlier})")
            };
            return Err(format!("{prefix}{key}: given twice{also}"));
        }
        self.seen.push((field, key.to_owned()));
        Ok(format!("{prefix}{key}"))
    }

    /// The message for the required key, once the map has ended without it.
    fn missing(&self) -> Option<String> {
        let (key, message) = self.shape.required?;
        let given = self.seen.iter().any(|(f, _)| *f == field_of(key));
        (!given).then(|| format!("{}{message}", self.prefix))
    }

    /// The message for a key that is not accepted. It lists one spelling per field, the
    /// camelCase one with its `Ms` as the TypeScript framework writes it, and suggests
    /// the spelling that differs from `key` only in case or `_`, if one does.
    fn unknown(&self, key: &str) -> String {
        let mut listed: Vec<&str> = Vec::new();
        for &spelling in self.fields.iter().filter(|s| !s.contains('_')) {
            match listed
                .iter_mut()
                .find(|m| field_of(m) == field_of(spelling))
            {
                Some(main) if spelling.len() > main.len() => *main = spelling,
                Some(_) => {}
                None => listed.push(spelling),
            }
        }
        let find = |f: &dyn Fn(&str) -> bool| self.fields.iter().find(|s| f(s));
        let snake = find(&|s| s.ends_with("_ms")).or_else(|| find(&|s| s.contains('_')));
        let snake = snake.map(|s| format!("; snake_case spellings such as {s} are accepted too"));
        let hint = find(&|s| fold(s) == fold(key)).map(|s| format!("; did you mean \"{s}\"?"));
        format!(
            "unknown key {} in {} (expected one of: {}{}){}",
            quote(key),
            self.context,
            listed.join(", "),
            snake.unwrap_or_default(),
            hint.unwrap_or_default()
        )
    }
}

/// A key with case, `_` and `-` ignored.
fn fold(key: &str) -> String {
    let kept = key.chars().filter(|c| *c != '_' && *c != '-');
    kept.flat_map(char::to_lowercase).collect()
}

/// The field an accepted spelling sets: the spellings of one field differ only in case,
/// `_` and a trailing `Ms` (`turnWaitMs`, `turn_wait_ms`, `turnWait`, `turn_wait`).
fn field_of(spelling: &str) -> String {
    let folded = fold(spelling);
    folded
        .strip_suffix("ms")
        .map_or(folded.clone(), str::to_owned)
}

struct StrictMap<A> {
    map: A,
    keys: Keys,
    /// The full name of the key whose value comes next.
    current: String,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(key) = self.map.next_key::<String>()? else {
            return self
                .keys
                .missing()
                .map_or(Ok(None), |m| Err(de::Error::custom(m)));
        };
        // The derive's own identifier decides which spellings it takes: with
        // `deny_unknown_fields` it refuses every other key. (Whether `fields` lists the
        // aliases too depends on the version of serde_derive.)
        let Ok(field) = seed.deserialize(StrDeserializer::<A::Error>::new(&key)) else {
            return Err(de::Error::custom(self.keys.unknown(&key)));
        };
        self.current = self.keys.admit(&key).map_err(de::Error::custom)?;
        Ok(Some(field))
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let map = &mut self.map;
        within(std::mem::take(&mut self.current), || {
            map.next_value_seed(seed)
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}
