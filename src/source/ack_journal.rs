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
//! Format: one line per ack, `ROUTE<TAB>MESSAGE_ID<TAB>CHECK`, where `CHECK` is the
//! FNV-1a hash of `ROUTE<TAB>MESSAGE_ID` in 16 hex digits. Several processes may append
//! to one file: each batch is one `write` on a file opened with `O_APPEND`, so whole
//! writes do not interleave. But a process killed mid-write can leave a line cut short
//! (a fatal signal ends a write early), and the next writer's lines then follow the
//! fragment on the same line: `orders<TAB>12orders<TAB>13<TAB>…`. Without the check
//! such a line would read as a message that was never acked (`12orders`) and fail the
//! check it exists for; with it, [`read`] drops every line whose check does not match
//! and says how many it dropped.

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
            let start = lines.len();
            lines.push_str(route);
            lines.push('\t');
            lines.extend(
                id.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }),
            );
            let check = line_check(&lines[start..]);
            lines.push('\t');
            lines.push_str(&check);
            lines.push('\n');
        }
        if lines.is_empty() {
            return Ok(());
        }
        let mut file = self.file.lock().expect("ack journal lock");
        file.write_all(lines.as_bytes())
    }
}

/// What a journal holds: its intact lines as (route, message id) pairs, and how many
/// lines were cut short by a killed writer (and dropped).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Journal {
    pub acks: Vec<(String, String)>,
    pub torn: usize,
}

/// Reads a journal: every line whose check matches; the others are counted as torn.
pub fn read(path: &Path) -> std::io::Result<Journal> {
    Ok(parse(&std::fs::read_to_string(path)?))
}

/// [`read`] on a journal's text (or a part of it that starts at a line).
pub fn parse(text: &str) -> Journal {
    let mut journal = Journal::default();
    for line in text.lines() {
        let intact = line
            .rsplit_once('\t')
            .filter(|(record, check)| line_check(record) == *check)
            .and_then(|(record, _)| record.split_once('\t'));
        match intact {
            Some((route, id)) => journal.acks.push((route.to_string(), id.to_string())),
            None => journal.torn += 1,
        }
    }
    journal
}

/// The check of one record: 64-bit FNV-1a, as 16 lowercase hex digits. Not a defence
/// against anyone (the file is the operator's); only a way to tell a whole line from
/// a cut one.
fn line_check(record: &str) -> String {
    let hash =
        record.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_torn_lines_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks");
        let journal = AckJournal::open(&path).unwrap();
        journal.record("orders", ["1", "2"]).unwrap();
        journal.record("orders", std::iter::empty()).unwrap();
        // A second writer appends to the same file.
        AckJournal::open(&path).unwrap().record("billing", ["7\n8"]).unwrap();
        // A writer killed mid-write leaves a fragment; the next writer's batch follows
        // it on the same line, so that line and no other is lost.
        let whole = std::fs::read_to_string(&path).unwrap();
        let fragment = &whole[..whole.find('\n').unwrap() - 3];
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(fragment.as_bytes()).unwrap();
        journal.record("orders", ["10", "11"]).unwrap();
        // And a last line cut short with nothing after it.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"orders\t9").unwrap();
        let read = read(&path).unwrap();
        let expect = |r: &str, i: &str| (r.to_string(), i.to_string());
        assert_eq!(
            read.acks,
            vec![expect("orders", "1"), expect("orders", "2"), expect("billing", "7\\n8"), expect("orders", "11")]
        );
        assert_eq!(read.torn, 2, "the glued line and the last fragment");
    }

    #[test]
    fn the_check_is_fnv1a() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(line_check(""), "cbf29ce484222325");
        assert_eq!(line_check("a"), "af63dc4c8601ec8c");
    }
}
