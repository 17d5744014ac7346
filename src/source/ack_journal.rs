//! The ack journal: an append-only file naming every Pub/Sub message Inlet acks,
//! written strictly after the batch's commit and before the ack is handed to the
//! client. Off unless `inlet run --ack-journal FILE` (or `app::Options`) asks for it.
//!
//! It exists because completeness on the pull path cannot be proven from the broker
//! side: the Pub/Sub emulator strands messages that a killed (or reconnecting) client
//! held, so "published = stored" may fail by luck. What Inlet controls can be checked
//! exactly instead: every line of the journal names a message that has its row
//! (*acked ⊆ stored*). A line may name a message whose ack never reached the broker
//! (the process died in between); that only makes the check stricter.
//!
//! Format: one line per ack, `ROUTE<TAB>MESSAGE_ID`. Several processes may append to
//! one file: each batch is one `write` on a file opened with `O_APPEND`, so lines do
//! not interleave. A process killed mid-write can leave a last line without its
//! newline; [`read`] drops it.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct AckJournal {
    path: PathBuf,
    file: Mutex<File>,
}

impl AckJournal {
    pub fn open(path: &Path) -> std::io::Result<AckJournal> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AckJournal { path: path.to_path_buf(), file: Mutex::new(file) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the acks of one batch. An error is returned, not swallowed: the caller
    /// must not ack what it could not record (the broker redelivers it instead).
    pub fn record<'a>(&self, route: &str, message_ids: impl IntoIterator<Item = &'a str>) -> std::io::Result<()> {
        let mut lines = String::new();
        for id in message_ids {
            // Ids are printable ASCII from the broker; a tab or newline would break
            // the format, so such an id is written escaped rather than trusted.
            lines.push_str(route);
            lines.push('\t');
            lines.extend(
                id.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }),
            );
            lines.push('\n');
        }
        if lines.is_empty() {
            return Ok(());
        }
        let mut file = self.file.lock().expect("ack journal lock");
        file.write_all(lines.as_bytes())
    }
}

/// The complete lines of a journal, as (route, message id) pairs.
pub fn read(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)?;
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    Ok(complete
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(route, id)| (route.to_string(), id.to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_a_torn_last_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks");
        let journal = AckJournal::open(&path).unwrap();
        journal.record("orders", ["1", "2"]).unwrap();
        journal.record("orders", std::iter::empty()).unwrap();
        // A second writer appends to the same file.
        AckJournal::open(&path).unwrap().record("billing", ["7\n8"]).unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"orders\t9").unwrap();
        let lines = read(&path).unwrap();
        let expect = |r: &str, i: &str| (r.to_string(), i.to_string());
        assert_eq!(lines, vec![expect("orders", "1"), expect("orders", "2"), expect("billing", "7\\n8")]);
    }
}
