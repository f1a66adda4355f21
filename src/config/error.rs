//! `ConfigError`: what every part of the config module reports.

use std::fmt;

/// A configuration that cannot be used: a file that does not load, or a value that
/// [`CoordinationConfig::validate`](crate::CoordinationConfig::validate) refuses. It displays as `invalid config: `
/// followed by one sentence naming the field and the value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    /// An error with the given one-sentence description (without the `invalid config: `
    /// prefix, which [`Display`](fmt::Display) adds).
    pub fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }

    /// The description, without the `invalid config: ` prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}
