//! The settings written as one of a few names: the session mode and the handover
//! policies.

use std::fmt;
use std::str::FromStr;

use serde::de::{Deserialize, Deserializer};

use super::error::ConfigError;
use super::settings::{FallbackPolicy, FlowsPolicy, ProviderSession};
use super::strict;
use super::value::{self, Raw, Scalar, quote};

/// Reads one of `choices`; the message names no field. A name that differs only in
/// case or surrounding blanks gets a hint, as it is the likeliest slip.
fn parse<T: Copy>(s: &str, choices: &[(&str, T)], what: &str, expected: &str) -> Result<T, String> {
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == s) {
        return Ok(*value);
    }
    let hint = choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s.trim()))
        .map(|(name, _)| format!("; did you mean \"{name}\"?"))
        .unwrap_or_default();
    Err(format!(
        "unknown {what} {} (expected {expected}){hint}",
        quote(s)
    ))
}

macro_rules! choice {
    ($ty:ident, $what:literal, $field:literal, $expected:literal,
     $($name:literal => $variant:ident),+) => {
        impl $ty {
            /// The value as written in config files.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = ConfigError;

            /// Reads the value as written in config files (lowercase, exact).
            fn from_str(s: &str) -> Result<Self, ConfigError> {
                let choices = [$(($name, $ty::$variant)),+];
                parse(s, &choices, $what, $expected).map_err(ConfigError::new)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            /// Reads the value as written in config files; errors name the field as
            #[doc = concat!("`", $field, "`")]
            /// when the value is read on its own.
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let name = strict::name_or($field);
                let read = |raw| match raw {
                    Raw::Str(s) => s.parse().map_err(|e: ConfigError| format!("{name}: {}", e.message())),
                    raw => Err(Raw::wrong(&raw, &name, $expected, false)),
                };
                value::read(deserializer, Scalar($expected, read))
            }
        }
    };
}

choice!(ProviderSession, "session mode", "providerSession", r#""leader", "shared" or "auto""#,
    "leader" => Leader, "shared" => Shared, "auto" => Auto);
choice!(FlowsPolicy, "flows policy", "flows", r#""drop" or "resume""#,
    "drop" => Drop, "resume" => Resume);
choice!(FallbackPolicy, "fallback policy", "fallback", r#""drop" or "restart""#,
    "drop" => Drop, "restart" => Restart);
