//! Claim check (docs/claim-check.md): a message that carries only a reference to its
//! payload — an object's name and its SHA-256, as attributes — has the payload fetched
//! from the route's store before `decode`, which gets the object's bytes as the
//! message's data. Plugins keep no I/O, and plugins of the current contract work
//! unchanged: to them a fetched message is a message with a large body.
//!
//! The inbox row keeps the message as it came (the reference), and the decoded event
//! the plugin made of the bytes; a re-decode fetches again, and the digest makes sure
//! it reads the same bytes.

use crate::config::{FetchConfig, FetchStore};

/// Fetches a route's referenced payloads.
pub struct Fetcher {
    config: FetchConfig,
    http: reqwest::Client,
}

/// Why a payload could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    /// Worth trying again (the store did not answer, in time or at all, or answered 5xx
    /// or 429): the message is redelivered, and parked after `limits.timeout_tries`.
    /// Otherwise the message is parked at once.
    pub transient: bool,
    /// The label of `inlet_fetch_failures_total`: `unavailable`, `timeout`,
    /// `not_found`, `refused`, `too_large`, `digest`, `no_digest`.
    pub kind: &'static str,
    pub reason: String,
}

impl FetchError {
    fn definitive(kind: &'static str, reason: String) -> FetchError {
        FetchError { transient: false, kind, reason }
    }

    fn transient(kind: &'static str, reason: String) -> FetchError {
        FetchError { transient: true, kind, reason }
    }
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "claim check: {}", self.reason)
    }
}

/// The labels of `inlet_fetch_failures_total`.
pub const FAILURE_KINDS: [&str; 7] =
    ["unavailable", "timeout", "not_found", "refused", "too_large", "digest", "no_digest"];

impl Fetcher {
    pub fn new(config: FetchConfig, http: reqwest::Client) -> Fetcher {
        Fetcher { config, http }
    }

    /// The payload a message refers to: `None` when it names no object (it is
    /// decoded as it came), else the object's bytes, checked against the digest the
    /// message carries and the route's size limit.
    pub async fn fetch(&self, attributes: &[(String, String)]) -> Option<Result<Vec<u8>, FetchError>> {
        let attribute = |name: &str| attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let object = attribute(&self.config.object_attribute)?;
        let Some(expected) = attribute(&self.config.sha256_attribute) else {
            return Some(Err(FetchError::definitive(
                "no_digest",
                format!(
                    "the message names object `{}` but carries no `{}` attribute with its SHA-256",
                    shown(object),
                    self.config.sha256_attribute
                ),
            )));
        };
        let work = self.get(object, expected);
        Some(match tokio::time::timeout(self.config.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::transient(
                "timeout",
                format!("object `{}` did not arrive within {:?}", shown(object), self.config.timeout),
            )),
        })
    }

    /// Whether the route deletes an entry's object when its entry is purged.
    pub fn deletes_on_purge(&self) -> bool {
        self.config.delete_on_purge
    }

    /// Deletes the object an entry's message named, if it named one: `Ok(true)` once
    /// it is gone (a 404 counts: it was gone already), `Ok(false)` when the message
    /// named none, `Err` with why it is still there.
    pub async fn delete(&self, attributes: &[(String, String)]) -> Result<bool, String> {
        let Some(object) = attributes.iter().find(|(k, _)| *k == self.config.object_attribute).map(|(_, v)| v) else {
            return Ok(false);
        };
        let url = self.url(object, false);
        let mut request = self.http.delete(&url);
        if let Some(token) = &self.config.token {
            request = request.bearer_auth(token.expose());
        }
        let shown_url = crate::redact::url(&url);
        let answer = tokio::time::timeout(self.config.timeout, request.send()).await;
        match answer {
            Ok(Ok(r)) if r.status().is_success() || r.status().as_u16() == 404 => Ok(true),
            Ok(Ok(r)) => Err(format!("{shown_url} answered {} to the delete", r.status().as_u16())),
            Ok(Err(e)) => Err(format!("the store at {shown_url} did not answer the delete: {e}")),
            Err(_) => Err(format!("the delete of {shown_url} did not finish within {:?}", self.config.timeout)),
        }
    }

    async fn get(&self, object: &str, expected: &str) -> Result<Vec<u8>, FetchError> {
        let url = self.url(object, true);
        let mut request = self.http.get(&url);
        if let Some(token) = &self.config.token {
            request = request.bearer_auth(token.expose());
        }
        let shown_url = crate::redact::url(&url);
        let mut response = request.send().await.map_err(|e| {
            FetchError::transient("unavailable", format!("the store at {shown_url} did not answer: {e}"))
        })?;
        let status = response.status().as_u16();
        match status {
            200 => {}
            404 => {
                return Err(FetchError::definitive(
                    "not_found",
                    format!("object `{}` does not exist ({shown_url} answered 404)", shown(object)),
                ));
            }
            429 | 500..=599 => {
                return Err(FetchError::transient("unavailable", format!("{shown_url} answered {status}")));
            }
            _ => return Err(FetchError::definitive("refused", format!("{shown_url} answered {status}"))),
        }
        let limit = self.config.max_bytes;
        let too_large = |size: u64| {
            FetchError::definitive(
                "too_large",
                format!("object `{}` is {size} bytes or more, over the route's limit of {limit}", shown(object)),
            )
        };
        if let Some(length) = response.content_length()
            && length > limit
        {
            return Err(too_large(length));
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            FetchError::transient("unavailable", format!("reading object `{}` failed: {e}", shown(object)))
        })? {
            if bytes.len() as u64 + chunk.len() as u64 > limit {
                return Err(too_large(bytes.len() as u64 + chunk.len() as u64));
            }
            bytes.extend_from_slice(&chunk);
        }
        let digest = crate::inbox::digest_hex(&bytes);
        if !digest.eq_ignore_ascii_case(expected.trim()) {
            return Err(FetchError::definitive(
                "digest",
                format!(
                    "object `{}` has SHA-256 {digest}, not the {} the message carries: it changed or is not the one meant",
                    shown(object),
                    shown(expected)
                ),
            ));
        }
        Ok(bytes)
    }

    /// The object's address; for Cloud Storage, its content (`download`) or the
    /// object itself (what a delete names).
    fn url(&self, object: &str, download: bool) -> String {
        match &self.config.store {
            FetchStore::Gcs { endpoint, bucket } => {
                let (bucket, object) = (percent_encode(bucket), percent_encode(object));
                let media = if download { "?alt=media" } else { "" };
                format!("{endpoint}/storage/v1/b/{bucket}/o/{object}{media}")
            }
            FetchStore::Http { prefix } => format!("{prefix}{}", percent_encode_path(object)),
        }
    }
}

/// An attribute's value as it appears in a reason: at most 200 bytes, control
/// characters escaped.
fn shown(text: &str) -> String {
    crate::rules::storable(text, 200).into_owned()
}

/// Everything but unreserved characters percent-encoded: an object name is one path
/// segment of the JSON API (`a/b.json` is `a%2Fb.json`).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Like [`percent_encode`], keeping `/` (an object under a prefix may have folders);
/// a `..` segment is encoded too, so it cannot climb out of the prefix.
fn percent_encode_path(text: &str) -> String {
    text.split('/')
        .map(|segment| if segment == ".." { "%2E%2E".to_string() } else { percent_encode(segment) })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_stay_one_segment_or_under_the_prefix() {
        assert_eq!(percent_encode("a/b c.json"), "a%2Fb%20c.json");
        assert_eq!(percent_encode_path("a/../b c"), "a/%2E%2E/b%20c");
        assert_eq!(percent_encode_path("../../etc/passwd"), "%2E%2E/%2E%2E/etc/passwd");
    }
}
