//! The one count setting in files, `dedupIds`: a whole number checked as
//! [`crate::coordinator`] checks it in code.

use serde::Deserializer;

use super::strict;
use super::value::{self, Raw, Scalar};

/// Reads `dedupIds`: a whole number from 1 to [`crate::MAX_DEDUP_IDS`], the handled
/// message ids each chat remembers at least.
pub(super) fn dedup_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let name = strict::name_or("dedupIds");
    let expected = "a whole number of message ids per chat from 1 to 10000, such as 64";
    value::read(
        d,
        Scalar(expected, |raw| match raw {
            Raw::Whole(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                crate::coordinator::check_dedup_ids(&name, n).map(|()| Some(n))
            }
            raw => Err(raw.wrong(&name, expected, false)),
        }),
    )
}
