//! Helpers every mode of the replay shares, and the chaos harness with it: the clock
//! the logs use, the simulated work, reading the input, and the original timing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::args::Options;
use crate::data::{self, Trace};

/// µs since the Unix epoch: the one clock every process of the host shares, so handler
/// intervals from different replica processes can be compared.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Simulated handler work for one update: `ms` ± up to `jitter` ms, drawn from a
/// generator seeded by the run's seed and the update's id (so an update gets the same
/// work whatever else the input holds).
pub fn work_of(update_id: i64, seed: u64, ms: f64, jitter: f64) -> Duration {
    let mut us = ms * 1000.0;
    if jitter > 0.0 {
        let mixed = seed ^ (update_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = StdRng::seed_from_u64(mixed);
        us += rng.gen_range(-jitter * 1000.0..=jitter * 1000.0);
    }
    Duration::try_from_secs_f64(us.max(0.0) / 1e6).unwrap_or_default()
}

/// The input path as shown in the summary: the bundled slice relative to the crate.
pub fn shown_path(o: &Options) -> String {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    o.updates
        .strip_prefix(manifest)
        .unwrap_or(&o.updates)
        .display()
        .to_string()
}

/// Reads `--updates`, telling stderr about lines that are not updates.
///
/// # Errors
/// A message naming the file when it cannot be read.
pub fn load_trace(o: &Options) -> Result<Trace, String> {
    let trace = data::load(&o.updates)?;
    if trace.malformed > 0 {
        eprintln!(
            "replay: {} line(s) of {} are not Telegram updates and were skipped (the first is line {})",
            trace.malformed,
            o.updates.display(),
            trace.first_malformed.unwrap_or(0)
        );
    }
    Ok(trace)
}

/// With `--speed`: when each update is due, from the start of the replay.
///
/// # Errors
/// When the speed-up would stretch the replay beyond any sensible length.
pub fn due_times(trace: &Trace, o: &Options) -> Result<Option<Vec<Duration>>, String> {
    let Some(speed) = o.speed else {
        return Ok(None);
    };
    let first = trace.entries.iter().map(|e| e.date).min().unwrap_or(0);
    let last = trace.entries.iter().map(|e| e.date).max().unwrap_or(0);
    let span = (last as f64 - first as f64) / speed;
    // A bound that keeps `Instant + due` far from overflowing.
    if span > 1e9 {
        return Err(format!(
            "--speed: {speed} would stretch this replay to {span:.0} s; use a larger speed-up"
        ));
    }
    Ok(Some(
        trace
            .entries
            .iter()
            .map(|e| {
                let s = (e.date as f64 - first as f64) / speed;
                Duration::try_from_secs_f64(s.max(0.0)).unwrap_or_default()
            })
            .collect(),
    ))
}
