//! botmesh's log records on stderr, for the examples: botmesh logs through the `log`
//! facade and installs no logger itself, so without one its warnings (a refused
//! token, a transport that cannot connect, a lease lost) go nowhere.

/// A logger writing each record as one line on stderr: µs since the Unix epoch, the
/// process's name, the level, the target and the text. The level comes from the
/// environment variable `BOTMESH_LOG` (`warn`, `info`, `debug`, `off`…) when it is
/// set, else from the default given.
pub struct StderrLog {
    name: String,
    level: log::LevelFilter,
}

impl StderrLog {
    /// Installs the logger unless `BOTMESH_LOG` and `default` both leave it off.
    pub fn install(name: &str, default: Option<log::LevelFilter>) {
        let from_env = std::env::var("BOTMESH_LOG")
            .ok()
            .and_then(|v| v.parse::<log::LevelFilter>().ok());
        let Some(level) = from_env.or(default) else {
            return;
        };
        let logger = Box::new(StderrLog {
            name: name.to_owned(),
            level,
        });
        if log::set_logger(Box::leak(logger)).is_ok() {
            log::set_max_level(level);
        }
    }
}

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let at_us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros());
            // One write per line: replica processes share the parent's stderr, and
            // `eprintln!` may write a line in pieces that interleave with theirs.
            let line = format!(
                "{at_us} {} {} {}: {}\n",
                self.name,
                record.level(),
                record.target(),
                record.args()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        }
    }

    fn flush(&self) {}
}
