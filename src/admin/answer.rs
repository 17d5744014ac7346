//! What the admin API answers: one typed body per endpoint, and one error shape for
//! every refusal — the handlers' own, the gate's, and the request parsing's alike:
//! `{"error": "…"}`, plus `entry`, `status` or `route` when they say more. API.md
//! documents every body; a client never has to read a Rust `Debug` string.
//!
//! The extractors here ([`Body`], [`Id`], [`Params`]) wrap axum's so that a body, a
//! path or a query string that does not parse is answered in that shape too, and
//! [`not_found`] / [`method_not_allowed`] answer paths no endpoint serves.

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::inbox::failures::{Attempt, FailureGroup};
use crate::inbox::{AuditRecord, Entry, Status, StoreError};
// The outcomes of operator actions are the API's answers to them, as they are the
// command line's `--json` output.
use crate::inbox::repair::RepairJob;
use crate::operate::Refusal;
pub use crate::operate::{PauseView, Purged, Repaired, RoutePaused};

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// What went wrong, as a sentence for people.
    pub error: String,
    /// The entry concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<i64>,
    /// The entry's state when that is why the request was refused (409).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// The route concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
}

/// An error answer: a status code and an [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    pub code: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(code: StatusCode, error: impl Into<String>) -> ApiError {
        ApiError { code, body: ErrorBody { error: error.into(), entry: None, status: None, route: None } }
    }

    pub fn bad_request(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, error)
    }

    /// 404 for an entry that is missing or on a route the caller may not see: the
    /// same answer for both.
    pub fn no_entry(id: i64) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, format!("no entry {id}")).entry(id)
    }

    /// 503 when the inbox is unreachable (try again), 400 when it refused a value
    /// of the request for what it holds (the same request fails again), 500 otherwise.
    pub fn store(e: StoreError) -> ApiError {
        if e.refuses_row() {
            return ApiError::bad_request(format!("the inbox cannot take a value of this request: {e}"));
        }
        let code = if e.is_transient() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
        ApiError::new(code, e.to_string())
    }

    pub fn entry(mut self, id: i64) -> ApiError {
        self.body.entry = Some(id);
        self
    }

    pub fn status(mut self, status: Status) -> ApiError {
        self.body.status = Some(status);
        self
    }

    pub fn route(mut self, route: impl Into<String>) -> ApiError {
        self.body.route = Some(route.into());
        self
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::store(e)
    }
}

/// A refused operator action as the API answers it: 404 for an entry that is not
/// there, 409 for a state the action does not apply to (naming the entry and its
/// state, or the route), 400 for input the action does not take.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let error = refusal.to_string();
        match refusal {
            Refusal::NoEntry(id) => ApiError::no_entry(id),
            Refusal::NotApplicable { entry, now, .. } => {
                ApiError::new(StatusCode::CONFLICT, error).entry(entry).status(now)
            }
            Refusal::Unexplained { entry, .. } => ApiError::new(StatusCode::CONFLICT, error).entry(entry),
            Refusal::EmptyReason { .. }
            | Refusal::NeedsReason { .. }
            | Refusal::Rate { .. }
            | Refusal::EmptyReplay { .. }
            | Refusal::ReplayOpenFor => ApiError::bad_request(error),
            Refusal::ReplayOverlaps { route, .. } => ApiError::new(StatusCode::CONFLICT, error).route(route),
            Refusal::NoOpenReplay(_) => ApiError::new(StatusCode::NOT_FOUND, error),
            Refusal::AlreadyPaused { route, .. } | Refusal::NotPaused(route) => {
                ApiError::new(StatusCode::CONFLICT, error).route(route)
            }
            Refusal::Store(e) => ApiError::store(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.code, Json(self.body)).into_response()
    }
}

/// A JSON request body (`Content-Type: application/json`); one that is missing,
/// malformed, of another type or over the size limit is answered as an [`ApiError`]
/// with axum's status (400, 413, 415, 422) and its explanation. A string holding a NUL
/// character is refused (400, naming the field): PostgreSQL cannot store one, and
/// both inboxes must answer alike.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let refused = |r: axum::extract::rejection::JsonRejection| ApiError::new(r.status(), r.body_text());
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::Bytes::from_request(Request::from_parts(parts.clone(), body), state).await {
            Ok(b) => b,
            Err(r) => return Err(ApiError::new(r.status(), r.body_text())),
        };
        let again = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
        let Json(v) = Json::<T>::from_request(again, state).await.map_err(refused)?;
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && let Some(field) = nul_in(&value, "")
        {
            return Err(ApiError::bad_request(format!(
                "`{field}` holds a NUL character, which the inbox cannot store"
            )));
        }
        Ok(Body(v))
    }
}

/// The path of the first key or string in `value` that holds a NUL character.
fn nul_in(value: &serde_json::Value, path: &str) -> Option<String> {
    let at = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        serde_json::Value::String(s) if s.contains('\0') => {
            Some(if path.is_empty() { "body".into() } else { path.into() })
        }
        serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_in(v, &at(&i.to_string()))),
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') { Some(at(&k.escape_debug().to_string())) } else { nul_in(v, &at(k)) }
        }),
        _ => None,
    }
}

/// The one path parameter of a route (an entry id, a route name).
pub struct Id<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Id<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(Id(v)),
            Err(r) => Err(ApiError::new(r.status(), r.body_text())),
        }
    }
}

/// The query string. A parameter holding a NUL character is refused (400, naming
/// it), as in [`Body`].
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let v = match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => v,
            Err(r) => return Err(ApiError::new(r.status(), r.body_text())),
        };
        if let Ok(Query(pairs)) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            && let Some((name, _)) = pairs.iter().find(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            let name = name.escape_debug();
            return Err(ApiError::bad_request(format!("query parameter `{name}` holds a NUL character")));
        }
        Ok(Params(v))
    }
}

/// The answer to a path no endpoint serves.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no endpoint {} (see API.md)", req.uri().path()))
}

/// The answer to a known path asked with another method.
pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{} does not take {}", req.uri().path(), req.method()))
}

/// A payload as people read it: text when it is UTF-8, else base64; withheld from
/// tokens without payload rights.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    Text(String),
    Base64(String),
    Withheld(&'static str),
}

impl Payload {
    pub fn of(bytes: &[u8]) -> Payload {
        match std::str::from_utf8(bytes) {
            Ok(s) => Payload::Text(s.to_string()),
            Err(_) => Payload::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }

    pub const WITHHELD: Payload = Payload::Withheld("this token may not read payloads");
}

/// A shadow sample's side without what may hold or quote a payload.
fn withhold_payloads(side: &mut serde_json::Value) {
    let serde_json::Value::Object(fields) = side else { return };
    for (name, value) in fields.iter_mut() {
        match name.as_str() {
            "body" | "state" | "reason" | "message" => *value = serde_json::Value::from(WITHHELD_TEXT),
            "headers" => {
                if let serde_json::Value::Array(headers) = value {
                    for header in headers {
                        if let Some(v) = header.get_mut(1) {
                            *v = serde_json::Value::from(WITHHELD_TEXT);
                        }
                    }
                }
            }
            _ => withhold_payloads(value),
        }
    }
}

/// What a reader without `payloads` gets in place of a text that may quote a payload.
pub const WITHHELD_TEXT: &str = "withheld: this token may not read payloads";

/// The payload rule, in one place: what of an entry, an attempt, a failure group or a
/// repair job its reader may see. A token without `payloads` reads neither the
/// payloads, nor their digest (`payload_digest` and the digest that ends a conflict's
/// dedup key: either confirms a guess of the payload offline), nor any text that may
/// quote one: an entry's `last_error` and its attempts' `reason` (a decode error
/// quotes the message, a target's answer may echo the request), a request's transport
/// error, a failure group's example error, and the `text` a repair job was filtered
/// by. Each is replaced by [`WITHHELD_TEXT`] (payloads by [`Payload::WITHHELD`]).
/// Such a reader may not filter by error text either ([`Reader::search`]): counting
/// the entries whose error contains a guess would read the payload a guess at a time.
///
/// Error fingerprints keep the words of an error (numbers, ids and quoted values
/// masked, `crate::inbox::failures::fingerprint`), so such a reader names a failure
/// group by its example entry instead ([`GroupRef`]), and may not filter by a
/// fingerprint it guessed ([`Reader::group`]).
///
/// Every handler that answers these (the API's and, through them, the console's)
/// shapes its answer here. What a plugin chose to expose as an address stays
/// visible: keys, dedup keys, event types and request paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reader {
    payloads: bool,
}

impl Reader {
    /// A reader of everything: the CLI, which reads the inbox directly.
    pub const ALL: Reader = Reader { payloads: true };

    pub fn of(caller: &super::access::Caller) -> Reader {
        Reader { payloads: caller.payloads }
    }

    /// A payload-bearing text as this reader sees it.
    pub fn text(self, text: Option<String>) -> Option<String> {
        if self.payloads { text } else { text.map(|_| WITHHELD_TEXT.to_string()) }
    }

    fn payload(self, bytes: &[u8]) -> Payload {
        if self.payloads { Payload::of(bytes) } else { Payload::WITHHELD }
    }

    /// The entry as this reader sees it. Withheld payloads are dropped from the
    /// entry itself too, so no page built from the view can show them.
    pub fn entry(self, mut entry: Entry) -> EntryView {
        let raw_data = self.payload(&entry.raw_data);
        let body = entry.body.as_deref().map(|b| self.payload(b));
        if !self.payloads {
            entry.raw_data = Vec::new();
            entry.body = None;
            // A digest confirms a guess of the payload offline (a card number in an
            // otherwise known message).
            entry.payload_digest = WITHHELD_TEXT.to_string();
            if let Some((key, _)) = entry.dedup_key.rsplit_once("#conflict-") {
                entry.dedup_key = format!("{key}#conflict-withheld");
            }
        }
        entry.last_error = self.text(entry.last_error.take());
        EntryView { entry, raw_data, body, attempts: None }
    }

    /// A shadow's report as this reader sees it: without `payloads`, the samples
    /// keep their addresses (keys, event types, methods, paths, header names) and
    /// lose bodies, states, header values and the texts that may quote a payload.
    pub fn shadow(self, mut report: crate::shadow::Report) -> crate::shadow::Report {
        if !self.payloads {
            for sample in &mut report.samples {
                withhold_payloads(&mut sample.serving);
                withhold_payloads(&mut sample.candidate);
            }
        }
        report
    }

    /// An attempt history as this reader sees it.
    pub fn attempts(self, mut attempts: Vec<Attempt>) -> Vec<Attempt> {
        for a in &mut attempts {
            a.reason = self.text(a.reason.take());
            for r in &mut a.requests {
                r.error = self.text(r.error.take());
            }
        }
        attempts
    }

    /// A failure group as this reader sees it. Without `payloads` the group is named
    /// by its example entry (`entry:ID`, see [`GroupRef`]) instead of its fingerprint:
    /// masking keeps the words of an error, and a target's answer may be a payload's
    /// words.
    pub fn failure_group(self, mut group: FailureGroup) -> FailureGroup {
        if !self.payloads {
            group.example_error = WITHHELD_TEXT.to_string();
            group.fingerprint = format!("{}{}", GroupRef::PREFIX, group.example_id);
        }
        group
    }

    /// A repair job as this reader sees it: the text it was filtered by was typed
    /// from an error, and its fingerprint was made from one.
    pub fn repair_job(self, mut job: RepairJob) -> RepairJob {
        job.filter.text = self.text(job.filter.text.take());
        job.filter.fingerprint = self.text(job.filter.fingerprint.take());
        job
    }

    /// The failure group a `fingerprint` filter names. A reader without `payloads`
    /// may name one only as `entry:ID` (403 otherwise): matching a guessed fingerprint
    /// would read an error a guess at a time.
    pub fn group(self, given: &str) -> Result<GroupRef, ApiError> {
        if let Some(id) = given.strip_prefix(GroupRef::PREFIX) {
            let id = id.trim().parse().map_err(|_| {
                ApiError::bad_request(format!("`{}ID` names a failure group by an entry id", GroupRef::PREFIX))
            })?;
            return Ok(GroupRef::Like(id));
        }
        if !self.payloads {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "a fingerprint is made from error texts, which may quote payloads; this token names a failure group as `entry:ID`",
            ));
        }
        Ok(GroupRef::Fingerprint(given.to_string()))
    }

    /// Whether this reader may filter by error text (`text` of a listing or a
    /// repair); 403 otherwise.
    pub fn search(self, text: Option<&str>) -> Result<(), ApiError> {
        if self.payloads || text.is_none() {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the `text` filter searches error texts, which may quote payloads; this token may not read payloads",
        ))
    }
}

/// A failure group as a `fingerprint` filter names it ([`Reader::group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRef {
    /// The fingerprint itself.
    Fingerprint(String),
    /// `entry:ID`: the group of the error entry ID has now, as `GET /api/failures`
    /// names groups to a token without `payloads`.
    Like(i64),
}

impl GroupRef {
    pub const PREFIX: &str = "entry:";
}

/// An entry as the API and `inlet inbox show --json` show it: every column, the
/// payloads as [`Payload`]s; made by [`Reader::entry`].
#[derive(Debug, Clone, Serialize)]
pub struct EntryView {
    #[serde(flatten)]
    pub entry: Entry,
    pub raw_data: Payload,
    /// The decoded event's body; absent until the entry is decoded.
    pub body: Option<Payload>,
    /// The attempt history, oldest first (`GET /api/entries/{id}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Attempt>>,
}

/// `GET /api/entries`: a page of entries; `next_after` is the `after` of the next
/// page (absent on the last one).
#[derive(Debug, Serialize)]
pub struct EntryPage {
    pub entries: Vec<EntryView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<i64>,
}

/// `GET /api/audit`: a page of audit lines, oldest first.
#[derive(Debug, Serialize)]
pub struct AuditPage {
    pub audit: Vec<AuditRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<i64>,
}

/// One route in `GET /api/routes`.
#[derive(Debug, Serialize)]
pub struct RouteView {
    pub name: String,
    /// `up` (running) or `refused` (its settings or plugin do not load).
    pub state: &'static str,
    /// The routing file that declares it.
    pub file: String,
    /// `push` or `pubsub`; absent when a refused route's settings do not say.
    pub source: Option<&'static str>,
    pub plugin: Option<String>,
    /// The running plugin's SHA-256; absent for a refused route.
    pub plugin_sha256: Option<String>,
    /// The SHA-256 the routing file pins the plugin to, if it pins one: a plugin file
    /// with another digest is refused.
    pub plugin_pinned_sha256: Option<String>,
    /// Why it is refused, or why a newer version of it was.
    pub error: Option<String>,
    /// Set while the route is paused: no instance claims its entries.
    pub paused: Option<PauseView>,
    /// The candidate run in shadow beside the plugin, as the file spells its path;
    /// its report is `GET /api/routes/{name}/shadow`.
    pub candidate: Option<String>,
    /// The version a rollback returns to (`previous` in the routing file).
    pub previous: Option<String>,
    /// The messages a pull route takes of its subscription (`source.select`), e.g.
    /// `type = "order"`; `None` when it takes every message.
    pub select: Option<String>,
}

/// A routing file refused whole that names no route that could be read (the routes
/// it declared before, if any, keep running their last good version).
#[derive(Debug, Serialize)]
pub struct RefusedFile {
    pub file: String,
    pub error: String,
}

/// `GET /api/routes`.
#[derive(Debug, Serialize)]
pub struct RouteList {
    pub routes: Vec<RouteView>,
    pub refused_files: Vec<RefusedFile>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
}
