//! The replicas' own records of the updates they handled (`--processes`).
//!
//! A replica process reports how each update ended on its stdout, but a replica that is
//! SIGKILLed after a handler ran and before its report got out takes that knowledge
//! with it: the platform redelivers the update, another replica answers `duplicate`
//! (rightly: it was handled), and the log would show no `handled` line for it. So each
//! replica also appends a `handled` line to a part file of its own *before the handler
//! returns*, i.e. while it still holds the chat's turn; the platform merges the part
//! files into its log at the end, adding the lines it never heard of with
//! `"recovered": true`.
//!
//! Durability: each line is one `write` on a file opened for appending, then a flush,
//! with no `sync_data`: once `write` returned the line is in the kernel's page cache,
//! which a killed process cannot take back. Only a crash of the whole machine could lose
//! it, and that is not a fault these runs inject (an fsync per handled message would
//! cost milliseconds on a disk).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::report::LogRecord;

/// Where replica `name` of a run writes its part file: `<base>.<name>.part`, where
/// `base` is the log's path (or a temporary path when there is no log).
pub fn path_for(base: &Path, name: &str) -> PathBuf {
    let mut text = base.as_os_str().to_owned();
    text.push(format!(".{name}.part"));
    PathBuf::from(text)
}

/// A replica's part file, shared by its worker threads.
pub struct PartWriter {
    file: Mutex<File>,
    path: PathBuf,
}

impl PartWriter {
    /// Opens `path` for appending (creating it).
    ///
    /// # Errors
    /// A message naming the path.
    pub fn open(path: &Path) -> Result<PartWriter, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--part: cannot open {}: {e}", path.display()))?;
        Ok(PartWriter {
            file: Mutex::new(file),
            path: path.to_path_buf(),
        })
    }

    /// Appends one line, in one `write`, and returns once the kernel has it.
    ///
    /// # Errors
    /// A message naming the file.
    pub fn record(&self, record: &LogRecord) -> Result<(), String> {
        let mut line =
            serde_json::to_vec(record).map_err(|e| format!("cannot encode a part line: {e}"))?;
        line.push(b'\n');
        let mut file = self.file.lock();
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// What a part file held.
#[derive(Debug, Default)]
pub struct Part {
    /// Its `handled` lines.
    pub records: Vec<LogRecord>,
    /// Lines that did not parse (at most the last one, torn by a kill, is expected).
    pub unreadable: usize,
}

/// Reads the part file at `path`; a missing file is an empty part (the replica died
/// before it handled anything, or before it started).
///
/// # Errors
/// A message naming the file when it exists but cannot be read.
pub fn read(path: &Path) -> Result<Part, String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Part::default()),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let mut part = Part::default();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<LogRecord>(&line) {
            Ok(record) => part.records.push(record),
            Err(_) => part.unreadable += 1,
        }
    }
    Ok(part)
}
