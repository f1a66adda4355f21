//! `--redis-stats`: what the run cost the Redis server, from `INFO` before and after.
//!
//! Read with plain commands on a connection of its own: `INFO commandstats` (calls and
//! µs per command, commands run inside scripts included), `INFO stats`
//! (`total_reads_processed`: one read event per request or pipeline that reached the
//! server, so a round trip), `INFO cpu` (the server's CPU time), `INFO memory` and
//! `DBSIZE`. The figures are deltas of the whole server, so the run should have the
//! server to itself; the snapshots' own commands are taken out.

use std::collections::BTreeMap;

/// One reading of the server's counters.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per command (`get`, `evalsha`, `script|load`, …): calls and µs.
    commands: BTreeMap<String, (u64, u64)>,
    /// `total_reads_processed`.
    reads: u64,
    /// `used_cpu_user` + `used_cpu_sys`, µs.
    cpu_us: f64,
    /// `used_memory`, bytes.
    memory: u64,
    /// `DBSIZE`.
    keys: u64,
}

/// Commands that run a script: their µs include the µs of the commands the script
/// calls, which `INFO commandstats` also lists under their own names.
const SCRIPT_RUNNERS: [&str; 5] = ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];

/// Commands botmesh's scripts call (so their µs are already in a script's µs, when no
/// client sends them directly, as in the replay).
const SCRIPT_INNER: [&str; 23] = [
    "get",
    "set",
    "del",
    "llen",
    "lpos",
    "lpop",
    "rpush",
    "lrem",
    "lrange",
    "hget",
    "hset",
    "hdel",
    "hmget",
    "hexists",
    "hincrby",
    "hgetall",
    "pexpire",
    "pttl",
    "time",
    "publish",
    "zadd",
    "zscore",
    "zremrangebyscore",
];

/// The snapshot's own commands, left out of the deltas.
const MEASUREMENT: [&str; 4] = ["info", "dbsize", "memory|usage", "client|setinfo"];

/// What the run cost, per handled message.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Cost {
    /// Handled messages the figures are divided by.
    pub messages: u64,
    /// Commands per message, script calls and the commands inside scripts both counted.
    pub commands_per_message: f64,
    /// Script calls (`EVALSHA` …) per message.
    pub scripts_per_message: f64,
    /// µs of command execution per message: scripts (their inner commands included)
    /// plus commands sent directly.
    pub command_us_per_message: f64,
    /// Server CPU (user + system) per message, µs: execution, networking, expiry.
    pub cpu_us_per_message: f64,
    /// Round trips per message: read events the server processed.
    pub round_trips_per_message: f64,
    /// Memory still used after the run, over what was used before, MB (10^6 bytes).
    pub memory_left_mb: f64,
    /// Keys left after the run, over those before.
    pub keys_left: i64,
    /// The commands with the most calls: name, calls per message, µs per call.
    pub top: Vec<(String, f64, f64)>,
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn parse_commands(info: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, stats)) = rest.split_once(':') else {
            continue;
        };
        let mut calls = 0;
        let mut usec = 0;
        for kv in stats.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => calls = v.trim().parse().unwrap_or(0),
                Some(("usec", v)) => usec = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        out.insert(name.to_owned(), (calls, usec));
    }
    out
}

/// Reads the server's counters now.
///
/// # Errors
/// A message when the server cannot be reached or answers something unexpected.
#[cfg(feature = "redis")]
pub fn take(url: &str) -> Result<Snapshot, String> {
    let client =
        redis::Client::open(url).map_err(|e| format!("--redis-stats: not a usable URL ({e})"))?;
    let mut con = client
        .get_connection_with_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| format!("--redis-stats: cannot connect: {e}"))?;
    let mut info = |section: &str| -> Result<String, String> {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut con)
            .map_err(|e| format!("--redis-stats: INFO {section}: {e}"))
    };
    let commands = parse_commands(&info("commandstats")?);
    let stats = info("stats")?;
    let cpu = info("cpu")?;
    let memory = info("memory")?;
    let num = |text: &str, name: &str| -> f64 {
        field(text, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut con)
        .map_err(|e| format!("--redis-stats: DBSIZE: {e}"))?;
    Ok(Snapshot {
        commands,
        reads: num(&stats, "total_reads_processed") as u64,
        cpu_us: (num(&cpu, "used_cpu_user") + num(&cpu, "used_cpu_sys")) * 1e6,
        memory: num(&memory, "used_memory") as u64,
        keys,
    })
}

/// Without the `redis` feature there is no server to read.
///
/// # Errors
/// Always.
#[cfg(not(feature = "redis"))]
pub fn take(_url: &str) -> Result<Snapshot, String> {
    Err("--redis-stats: botmesh was built without its `redis` feature".to_owned())
}

/// The cost of the run between `before` and `after`, per handled message.
pub fn cost(before: &Snapshot, after: &Snapshot, messages: u64) -> Cost {
    let per = |x: f64| {
        if messages == 0 {
            0.0
        } else {
            x / messages as f64
        }
    };
    let mut calls = 0u64;
    let mut scripts = 0u64;
    let mut usec = 0u64;
    let mut rows = Vec::new();
    for (name, &(c, u)) in &after.commands {
        if MEASUREMENT.contains(&name.as_str()) {
            continue;
        }
        let (c0, u0) = before.commands.get(name).copied().unwrap_or((0, 0));
        let (dc, du) = (c.saturating_sub(c0), u.saturating_sub(u0));
        if dc == 0 {
            continue;
        }
        calls += dc;
        if SCRIPT_RUNNERS.contains(&name.as_str()) {
            scripts += dc;
            usec += du;
        } else if !SCRIPT_INNER.contains(&name.as_str()) {
            usec += du;
        }
        rows.push((name.clone(), per(dc as f64), du as f64 / dc as f64));
    }
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.truncate(12);
    // The `before` snapshot's own five requests reached the server after its counters
    // were read.
    let reads = after.reads.saturating_sub(before.reads).saturating_sub(5);
    let round = |v: f64| (v * 100.0).round() / 100.0;
    Cost {
        messages,
        commands_per_message: round(per(calls as f64)),
        scripts_per_message: round(per(scripts as f64)),
        command_us_per_message: round(per(usec as f64)),
        cpu_us_per_message: round(per(after.cpu_us - before.cpu_us)),
        round_trips_per_message: round(per(reads as f64)),
        memory_left_mb: round((after.memory as f64 - before.memory as f64) / 1e6),
        keys_left: after.keys as i64 - before.keys as i64,
        top: rows
            .into_iter()
            .map(|(n, c, u)| (n, round(c), round(u)))
            .collect(),
    }
}

impl Cost {
    /// The lines of the human summary.
    pub fn human(&self) -> String {
        let top: Vec<String> = self
            .top
            .iter()
            .map(|(n, c, u)| format!("{n} {c}/msg ({u} µs)"))
            .collect();
        format!(
            "  redis cost   per message: {} commands ({} script calls), {} µs in commands, \
             {} µs server CPU, {} round trips\n  \
             redis left   {} MB, {} keys\n  \
             commands     {}\n",
            self.commands_per_message,
            self.scripts_per_message,
            self.command_us_per_message,
            self.cpu_us_per_message,
            self.round_trips_per_message,
            self.memory_left_mb,
            self.keys_left,
            top.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats_lines() {
        let info = "# Commandstats\r\ncmdstat_get:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\ncmdstat_script|load:calls=1,usec=5,usec_per_call=5.00\r\n";
        let c = parse_commands(info);
        assert_eq!(c.get("get"), Some(&(3, 9)));
        assert_eq!(c.get("script|load"), Some(&(1, 5)));
        assert_eq!(
            field("a:1\r\nused_memory:42\r\n", "used_memory"),
            Some("42")
        );
    }
}
