//! Durations: the one type config files write them as, and the range of each setting.

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer};

use super::error::ConfigError;
use super::strict;
use super::value::{self, Raw, Scalar};

/// The largest duration of any setting, in milliseconds: 2^31 − 1, the largest the
/// TypeScript framework accepts (the limit of a JavaScript timer).
pub(super) const MAX_MILLIS: u64 = 2_147_483_647;
/// The shortest lease TTL accepted: a shorter lease would expire before it could be
/// renewed.
pub(super) const MIN_LEASE_TTL: Duration = Duration::from_millis(10);
const EXPECTED: &str = r#"a duration such as "2m" or a whole number of milliseconds"#;

/// The shortest duration a setting accepts, and why; the longest is [`MAX_MILLIS`] for
/// every setting.
pub(super) trait Bound {
    const MIN: Duration;
    const WHY: &'static str;
}

macro_rules! bounds {
    ($($(#[$attr:meta])* $name:ident: $min:expr, $why:literal;)*) => {$(
        $(#[$attr])*
        pub(super) enum $name {}
        $(#[$attr])*
        impl Bound for $name {
            const MIN: Duration = $min;
            const WHY: &'static str = $why;
        }
    )*};
}

bounds! {
    /// Any duration up to the maximum, zero included.
    Any: Duration::ZERO, "";
    /// More than zero.
    TurnWait: Duration::from_nanos(1), "no message could ever get its chat's turn";
    LeaseTtl: MIN_LEASE_TTL,
        "a lease that short would expire before it could be renewed";
    #[cfg(feature = "redis")]
    CommandTimeout: Duration::from_millis(1), "every Redis call would time out at once";
}

/// Checks `d` against `B`; `shown` is the value as the user wrote it.
fn check<B: Bound>(name: &str, shown: &str, d: Duration) -> Result<Duration, String> {
    if d > Duration::from_millis(MAX_MILLIS) {
        Err(format!(
            "{name}: {shown} is too large; the longest accepted duration is {MAX_MILLIS} ms \
             (about 24.8 days)"
        ))
    } else if d >= B::MIN {
        Ok(d)
    } else if B::MIN == Duration::from_nanos(1) {
        let why = B::WHY;
        Err(format!(
            "{name}: {shown} is zero; it must be more than zero, or {why}"
        ))
    } else {
        let (min, why) = (B::MIN.as_millis(), B::WHY);
        Err(format!(
            "{name}: {shown} is too short ({min}ms is the minimum); {why}"
        ))
    }
}

/// Checks a duration set in code; the message shows it in humantime form.
pub(super) fn check_set<B: Bound>(name: &str, d: Duration) -> Result<(), ConfigError> {
    let shown = humantime::format_duration(d).to_string();
    check::<B>(name, &shown, d)
        .map(drop)
        .map_err(ConfigError::new)
}

/// A duration setting as a config file writes it: a [`humantime`] string (`"2m"`,
/// `"1500ms"`, `"1h 30m"`) or a whole number of milliseconds, within `B` and at most
/// [`MAX_MILLIS`]; `None` (its `Default`) when the file leaves it out. Errors name the
/// setting being read and the value as written.
pub(super) struct FileDuration<B>(Option<Duration>, PhantomData<B>);

impl<B> FileDuration<B> {
    /// The duration read, or `default` when none was.
    pub(super) fn or(self, default: Duration) -> Duration {
        self.0.unwrap_or(default)
    }

    /// The duration, if the file gave one.
    pub(super) fn given(self) -> Option<Duration> {
        self.0
    }
}

impl<B> Default for FileDuration<B> {
    fn default() -> Self {
        FileDuration(None, PhantomData)
    }
}

impl<'de, B: Bound> Deserialize<'de> for FileDuration<B> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = strict::name_or("duration");
        let d = value::read(deserializer, Scalar(EXPECTED, |raw| parse::<B>(&name, raw)))?;
        Ok(FileDuration(Some(d), PhantomData))
    }
}

fn parse<B: Bound>(name: &str, raw: Raw) -> Result<Duration, String> {
    let (written, _) = raw.shown();
    let refuse = |why: &str| Err(format!("{name}: {written} {why}; expected {EXPECTED}"));
    let d = match &raw {
        Raw::Str(s) => match humantime::parse_duration(s.trim()) {
            Ok(d) => d,
            // Too large even for `Duration`: certainly over the maximum.
            Err(humantime::DurationError::NumberOverflow) => Duration::MAX,
            Err(humantime::DurationError::Empty) => return refuse("is empty"),
            Err(e) => return refuse(&format!("is not a duration ({e})")),
        },
        Raw::Whole(ms) => Duration::from_millis(*ms),
        Raw::Float(v) if !v.is_finite() => return refuse("is not a finite number"),
        Raw::Negative(_) => return refuse("is negative"),
        Raw::Float(v) if *v < 0.0 => return refuse("is negative"),
        Raw::Float(v) if v.fract() != 0.0 => return refuse("has a fractional part"),
        Raw::Float(v) if *v > MAX_MILLIS as f64 => Duration::MAX,
        // Whole, finite and within 0..=MAX_MILLIS, so the conversion is exact.
        Raw::Float(v) => Duration::from_millis(*v as u64),
        Raw::Other(..) => return Err(raw.wrong(name, EXPECTED, false)),
    };
    check::<B>(name, &written, d)
}
