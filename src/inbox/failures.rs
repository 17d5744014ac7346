//! What an operator starts from on a bad night: the attempts of an entry, and the
//! entries that fail grouped by what their errors have in common.
//!
//! An error's **fingerprint** is its text with what differs from entry to entry
//! masked: numbers, hex ids and UUIDs, quoted and backticked values (keys, ids, field
//! values). "target answered 500 for order `A-17` after 2003 ms" and "target answered
//! 500 for order `B-9` after 87 ms" share one. It is computed when the error is
//! written, kept beside it (`error_fingerprint`), and indexed, so grouping is one
//! aggregate over the unresolved rows.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::inbox::Status;

/// How many characters of the masked text make the fingerprint.
const FINGERPRINT_CHARS: usize = 160;

/// The error with what varies between entries masked (see the module doc).
pub fn fingerprint(error: &str) -> String {
    let mut out = String::with_capacity(error.len().min(FINGERPRINT_CHARS * 2));
    let mut chars = error.chars().peekable();
    let mut word = String::new();
    // The word before, to keep an HTTP status after "answered"/"status": a 404 and a
    // 500 are different failures.
    let mut previous = String::new();
    let flush = |word: &mut String, out: &mut String, previous: &mut String| {
        if !word.is_empty() {
            let status = word.len() == 3 && word.parse::<u16>().is_ok_and(|n| (100..600).contains(&n));
            if status && (previous == "answered" || previous == "status") {
                out.push_str(word);
            } else {
                out.push_str(&mask_word(word));
            }
            *previous = std::mem::take(word);
        }
    };
    while let Some(c) = chars.next() {
        if out.chars().count() >= FINGERPRINT_CHARS {
            break;
        }
        match c {
            '`' | '"' | '\'' => {
                flush(&mut word, &mut out, &mut previous);
                // A quoted value: masked whole, up to its closing quote (or the end).
                out.push(c);
                out.push('…');
                for q in chars.by_ref() {
                    if q == c {
                        out.push(c);
                        break;
                    }
                }
            }
            c if c.is_alphanumeric() || c == '-' || c == '_' || c == '.' => word.push(c),
            c => {
                flush(&mut word, &mut out, &mut previous);
                out.push(c);
            }
        }
    }
    flush(&mut word, &mut out, &mut previous);
    out
}

/// A word as it counts for grouping: digits become `#` (`A-17` → `A-#`, `2003` → `#`),
/// and a word that looks like an id (hex of 8 or more, a UUID) becomes `#` whole.
fn mask_word(word: &str) -> String {
    let hexish = word.chars().filter(|c| c.is_ascii_hexdigit()).count();
    let has_digit = word.chars().any(|c| c.is_ascii_digit());
    if has_digit && hexish >= 8 && word.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return "#".into();
    }
    let mut out = String::with_capacity(word.len());
    let mut in_number = false;
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            // `1.5` and `1,000` stay one number.
            if !(in_number && (c == '.' || c == ',')) {
                in_number = false;
                out.push(c);
            }
        }
    }
    out
}

/// Entries of one route failing alike: parked, or waiting for a retry after a failed
/// attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureGroup {
    pub route: String,
    pub fingerprint: String,
    pub parked: i64,
    pub retrying: i64,
    /// Distinct correlation keys among them (keys stalled, under `block-key`).
    pub keys: i64,
    /// When the first and the last of them reached this error.
    pub first_seen: Millis,
    pub last_seen: Millis,
    /// The oldest entry of the group, and its error as written.
    pub example_id: i64,
    pub example_error: String,
}

/// One request of an attempt: what was sent and what came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub step: u32,
    pub method: String,
    pub path: String,
    /// The target's status, or `None` when no answer came (`error` says why).
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One delivery attempt of an entry, recorded with the settle that ended it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first attempt of the current run (a requeue starts a new run).
    pub attempt: i32,
    /// The instance that made it.
    pub owner: String,
    pub started_at: Millis,
    pub duration_ms: i64,
    /// What the plugin made of it: `done`, `retry`, `not_yet`, `park`, `ignore`,
    /// `decoded` (a requeued entry decoded again), or `panic`.
    pub answer: String,
    /// The entry's status after it: OPEN (to be retried), DONE, PARKED or IGNORED.
    pub status: Status,
    /// The error or reason the attempt ended with.
    pub reason: Option<String>,
    pub requests: Vec<RequestRecord>,
    /// Digest of the plugin version that handled it.
    pub plugin: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_varies_between_entries_is_masked() {
        let a = fingerprint("target answered 500 for order `A-17` after 2003 ms: {\"id\":\"x1\"}");
        let b = fingerprint("target answered 500 for order `B-9` after 87 ms: {\"id\":\"zz\"}");
        assert_eq!(a, b);
        assert_eq!(a, "target answered 500 for order `…` after # ms: {\"…\":\"…\"}");
        assert_ne!(a, fingerprint("target answered 404 for order `A-17` after 2003 ms: {\"id\":\"x1\"}"));
        assert_eq!(fingerprint("entry 3f2a9c1e0b7d4e21 at 1.5s"), "entry # at #s");
        assert_eq!(fingerprint("id 123e4567-e89b-12d3-a456-426614174000"), "id #");
        assert_eq!(fingerprint("key-17 and key-4"), "key-# and key-#");
        // Different errors stay apart.
        assert_ne!(fingerprint("target answered 500"), fingerprint("connect error reaching the target"));
        assert_eq!(
            fingerprint("gave up after 7 attempts: target answered 503"),
            "gave up after # attempts: target answered 503"
        );
        assert_ne!(fingerprint("decode failed: missing field"), fingerprint("decode failed: expected value"));
    }

    #[test]
    fn a_long_or_unterminated_error_is_bounded() {
        let long = "x ".repeat(10_000);
        assert!(fingerprint(&long).chars().count() <= FINGERPRINT_CHARS + 1);
        assert_eq!(fingerprint("bad value `abc"), "bad value `…");
    }
}
