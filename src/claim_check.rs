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
        let request = self.authorized(self.http.delete(&url), "DELETE", &url);
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
        let request = self.authorized(self.http.get(&url), "GET", &url);
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

    /// `request` with the store's credentials: the bearer token, or for S3 the
    /// Signature Version 4 headers.
    fn authorized(&self, mut request: reqwest::RequestBuilder, method: &str, url: &str) -> reqwest::RequestBuilder {
        if let Some(token) = &self.config.token {
            request = request.bearer_auth(token.expose());
        }
        if let FetchStore::S3 { region, access_key_id, secret_access_key, .. } = &self.config.store {
            let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
            let amz_date: String = now.chars().filter(|c| *c != '-' && *c != ':').collect();
            let key = sigv4::Key { region, access_key_id: access_key_id.expose(), secret: secret_access_key.expose() };
            for (name, value) in sigv4::sign(method, url, &[], &amz_date, &key) {
                request = request.header(name, value);
            }
        }
        request
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
            FetchStore::S3 { endpoint, bucket, .. } => {
                format!("{endpoint}/{}/{}", percent_encode(bucket), percent_encode_path(object))
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

/// AWS Signature Version 4 for S3 requests without a body (GET, DELETE), path-style,
/// as AWS documents it: the canonical request, the string to sign, the signing key
/// derived from the secret by date, region and service, and the `Authorization`
/// header. Written against the documentation and checked against its worked example
/// (and botocore's answer for a path-style request): see the tests below.
mod sigv4 {
    use sha2::{Digest, Sha256};

    /// The SHA-256 of an empty body.
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    pub struct Key<'a> {
        pub region: &'a str,
        pub access_key_id: &'a str,
        pub secret: &'a str,
    }

    /// The headers that sign a bodiless `method` request to `url` at `amz_date`
    /// (`YYYYMMDDTHHMMSSZ`, UTC), with `extra` headers (lowercase names) signed too:
    /// `x-amz-date`, `x-amz-content-sha256` and `authorization`. The URL's path must
    /// be encoded already, each segment once, as S3 wants it.
    pub fn sign(
        method: &str,
        url: &str,
        extra: &[(&str, &str)],
        amz_date: &str,
        key: &Key<'_>,
    ) -> Vec<(String, String)> {
        let (host, path) = host_and_path(url);
        let mut headers: Vec<(String, String)> =
            extra.iter().map(|(k, v)| (k.to_string(), v.trim().to_string())).collect();
        headers.push(("host".into(), host));
        headers.push(("x-amz-content-sha256".into(), EMPTY_SHA256.into()));
        headers.push(("x-amz-date".into(), amz_date.into()));
        headers.sort();
        let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        let signed = signed.join(";");
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let canonical = format!("{method}\n{path}\n\n{canonical_headers}\n{signed}\n{EMPTY_SHA256}");
        let date = &amz_date[..8];
        let scope = format!("{date}/{}/s3/aws4_request", key.region);
        let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex(&Sha256::digest(canonical.as_bytes())));
        let mut signing = hmac(format!("AWS4{}", key.secret).as_bytes(), date.as_bytes());
        for part in [key.region, "s3", "aws4_request"] {
            signing = hmac(&signing, part.as_bytes());
        }
        let signature = hex(&hmac(&signing, to_sign.as_bytes()));
        vec![
            ("x-amz-date".into(), amz_date.into()),
            ("x-amz-content-sha256".into(), EMPTY_SHA256.into()),
            (
                "authorization".into(),
                format!(
                    "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
                    key.access_key_id
                ),
            ),
        ]
    }

    /// The `Host` header a client sends for `url` (the port only when not the
    /// scheme's default) and the path (`/` when empty), without the query.
    fn host_and_path(url: &str) -> (String, String) {
        let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = path.split('?').next().unwrap_or("/");
        let host = match (scheme, authority.rsplit_once(':')) {
            ("http", Some((h, "80"))) | ("https", Some((h, "443"))) => h.to_string(),
            _ => authority.to_string(),
        };
        (host, path.to_string())
    }

    /// HMAC-SHA256 (RFC 2104).
    fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
        const BLOCK: usize = 64;
        let mut k = if key.len() > BLOCK { Sha256::digest(key).to_vec() } else { key.to_vec() };
        k.resize(BLOCK, 0);
        let inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        let outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        let inner_hash = Sha256::new().chain_update(&inner).chain_update(message).finalize();
        Sha256::new().chain_update(&outer).chain_update(inner_hash).finalize().to_vec()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const KEY: Key<'static> = Key {
            region: "us-east-1",
            access_key_id: "AKIAIOSFODNN7EXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        };

        fn authorization(headers: &[(String, String)]) -> &str {
            &headers.iter().find(|(k, _)| k == "authorization").expect("signed").1
        }

        /// AWS's worked example "GET Object" (Signature Version 4, header-based
        /// authentication, S3 API reference): the signature it documents.
        #[test]
        fn the_documented_get_object_example() {
            let headers = sign(
                "GET",
                "https://examplebucket.s3.amazonaws.com/test.txt",
                &[("range", "bytes=0-9")],
                "20130524T000000Z",
                &KEY,
            );
            assert_eq!(
                authorization(&headers),
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
                 SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
                 Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
            );
        }

        /// A path-style request to a local store on a port, with an encoded name: the
        /// signature botocore 1.x (`S3SigV4Auth`, same key and time) gives it.
        #[test]
        fn a_path_style_request_on_a_port_as_botocore_signs_it() {
            let headers =
                sign("GET", "http://127.0.0.1:9000/payloads/orders/big%201.json", &[], "20130524T000000Z", &KEY);
            assert!(authorization(&headers).ends_with(
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
                 Signature=6d4b6b95748035bc34ff5706ffb510b844d858d72d8a4667f1e757f8ae6752d0"
            ));
        }

        #[test]
        fn hmac_matches_rfc_4231_case_2() {
            assert_eq!(
                hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
            );
        }
    }
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
