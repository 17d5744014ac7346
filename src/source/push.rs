//! Pub/Sub push: `POST /push/<route>` with the push envelope. A 2xx answer is the
//! ack, so it is sent only after the row is committed; 503 when the inbox is
//! unreachable (Pub/Sub redelivers); 503 too for a route that is refused (its plugin or
//! settings do not load), so its messages wait in Pub/Sub until it is fixed — after its
//! push auth, and without the reason; 404 for a
//! route no routing file names; 415 for a body not sent as JSON; 400 for a body that
//! is not a push envelope ([`PushEnvelope::parse`] names the field at fault).
//!
//! A route with `wrapper = false` takes unwrapped pushes (`--push-no-wrapper`): the
//! body is the message's data, whatever its type, and the message's metadata and
//! attributes come as headers ([`unwrapped_message`]).
//!
//! [`limit`] stands in front of the handler and protects the process: at most
//! `max_concurrent_pushes` requests at once (one more is shed with 503 and
//! `Retry-After` before its body is read), bodies up to `max_body_mib` (413), and one
//! deadline for the whole request (408 while the body is still arriving, 503 after).
//! None of these answers is an ack, so Pub/Sub redelivers and nothing is lost.
//!
//! 404 for a route that is not a push route (a pull route takes no pushes). A
//! route with push auth checks the OIDC token first ([`super::push_auth`]): no
//! row is written for a refused request.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{OidcPush, PushAuth, ServerConfig, SourceConfig};
use crate::inbox::InsertOutcome;
use crate::ingest::{Accepted, Incoming, Ingest, IngestError, Stored};
use crate::routing::RouteTable;
use crate::source::push_auth::Verifier;
use crate::telemetry::Metrics;
use crate::telemetry::RouteReason;

/// Seconds a shed or timed-out push is told to wait (`Retry-After`). Pub/Sub applies
/// its own backoff; other senders get a hint that the pressure is brief.
const RETRY_AFTER_SECS: &str = "1";

/// The push envelope Pub/Sub sends,
/// `{"message": {"data", "attributes", "messageId", "publishTime"}, "subscription", "deliveryAttempt"}`.
/// Google sends camelCase; the emulator sends both camelCase and snake_case twins and
/// omits `deliveryAttempt`, so both spellings are accepted. The ordering key becomes
/// the attribute `ordering_key`, as the pull source stores it. Fields Inlet does not
/// use are ignored; a field it uses must have its type.
pub struct PushEnvelope;

/// Why a push body is not a usable envelope: the field at fault (`body` for the
/// request body as a whole, else a path such as `message.data`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("push envelope: `{field}` {problem}")]
pub struct EnvelopeError {
    pub field: String,
    pub problem: String,
}

impl EnvelopeError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> EnvelopeError {
        EnvelopeError { field: field.into(), problem: problem.into() }
    }
}

/// `data` is proto3 JSON `bytes`: standard base64 with padding as Google writes it,
/// and, as the proto3 JSON mapping requires of readers, the URL-safe alphabet and
/// missing padding too. Trailing bits must be zero (a canonical encoding).
const DATA_STANDARD: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);
const DATA_URL_SAFE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The JSON type of a value, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An object key as an error message shows it: escaped, and cut after 64 characters.
fn shown_key(key: &str) -> String {
    let escaped: String = key.escape_debug().collect();
    match escaped.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &escaped[..cut]),
        None => escaped,
    }
}

/// An optional string field `name` of the object at `prefix` (empty, or ending in a
/// dot): absent and `null` are `None`.
fn opt_str<'a>(obj: &'a Map<String, Value>, prefix: &str, name: &str) -> Result<Option<&'a str>, EnvelopeError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => {
            Err(EnvelopeError::new(format!("{prefix}{name}"), format!("must be a string, not {}", kind(other))))
        }
    }
}

/// An optional delivery attempt: a whole number from 0 to 2^32 - 1.
fn opt_attempt(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, EnvelopeError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| {
                EnvelopeError::new(name, format!("must be a whole number from 0 to {}, not {n}", u32::MAX))
            })
        }
        Some(other) => Err(EnvelopeError::new(name, format!("must be a number, not {}", kind(other)))),
    }
}

/// The first of two spellings of a string field that is present.
fn either_str<'a>(
    obj: &'a Map<String, Value>,
    camel: &str,
    snake: &str,
    prefix: &str,
) -> Result<Option<&'a str>, EnvelopeError> {
    let first = opt_str(obj, prefix, camel)?;
    let second = opt_str(obj, prefix, snake)?;
    Ok(first.or(second))
}

/// JSON read into a [`Value`], but a key given twice in one object is refused (its
/// path is kept in `twice`): a reader that takes the last and one that takes the
/// first (a proxy, a log) would see different messages. The path is a chain of
/// borrowed steps, written out only for that error: building it as a string for
/// every key and array element was the push path's most frequent allocation.
struct Strict<'a> {
    up: Option<(&'a Strict<'a>, Step<'a>)>,
    twice: &'a std::cell::RefCell<Option<String>>,
}

/// One step down from a JSON value: an object's key or an array's index.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

impl<'a> Strict<'a> {
    fn child<'b>(&'b self, step: Step<'b>) -> Strict<'b> {
        Strict { up: Some((self, step)), twice: self.twice }
    }

    /// The dotted path of this value's key `last` (shown as error messages show keys).
    fn path_of(&self, last: &str) -> String {
        let mut steps = vec![shown_key(last)];
        let mut at = self;
        while let Some((parent, step)) = &at.up {
            steps.push(match step {
                Step::Key(key) => key.to_string(),
                Step::Index(i) => i.to_string(),
            });
            at = parent;
        }
        steps.reverse();
        steps.join(".")
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(self.child(Step::Index(items.len())))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.child(Step::Key(&key)))?;
            if out.contains_key(&key) {
                *self.twice.borrow_mut() = Some(self.path_of(&key));
                return Err(serde::de::Error::custom("a key appears twice"));
            }
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

impl PushEnvelope {
    /// The message of a push body in Inlet's terms, or the field that makes it
    /// unusable. Any bytes give one or the other (serde_json bounds the nesting, so a
    /// deeply nested body is an error, not a stack overflow).
    pub fn parse(body: &[u8]) -> Result<Incoming, EnvelopeError> {
        let twice = std::cell::RefCell::new(None);
        let mut reader = serde_json::Deserializer::from_slice(body);
        let value = serde::de::DeserializeSeed::deserialize(Strict { up: None, twice: &twice }, &mut reader)
            .and_then(|v| reader.end().map(|()| v))
            .map_err(|e| match twice.take() {
                Some(path) => EnvelopeError::new(path, "appears twice in one object"),
                None => EnvelopeError::new("body", format!("is not JSON: {e}")),
            })?;
        let Value::Object(top) = value else {
            return Err(EnvelopeError::new("body", format!("must be a JSON object, not {}", kind(&value))));
        };
        let message = match top.get("message") {
            Some(Value::Object(m)) => m,
            None | Some(Value::Null) => return Err(EnvelopeError::new("message", "is missing")),
            Some(other) => {
                return Err(EnvelopeError::new("message", format!("must be an object, not {}", kind(other))));
            }
        };
        opt_str(&top, "", "subscription")?;
        let delivery_attempt = opt_attempt(&top, "deliveryAttempt")?.or(opt_attempt(&top, "delivery_attempt")?);

        let message_id = match either_str(message, "messageId", "message_id", "message.")? {
            Some("") => return Err(EnvelopeError::new("message.messageId", "is empty")),
            Some(id) => id.to_string(),
            None => return Err(EnvelopeError::new("message.messageId", "is missing")),
        };
        let data = match opt_str(message, "message.", "data")? {
            None | Some("") => Vec::new(),
            Some(b64) => {
                let engine = if b64.contains(['-', '_']) { &DATA_URL_SAFE } else { &DATA_STANDARD };
                engine.decode(b64).map_err(|e| EnvelopeError::new("message.data", format!("is not base64: {e}")))?
            }
        };
        let mut attributes = match message.get("attributes") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(attrs)) => {
                let mut out = Vec::with_capacity(attrs.len());
                for (k, v) in attrs {
                    let Value::String(v) = v else {
                        let field = format!("message.attributes.{}", shown_key(k));
                        return Err(EnvelopeError::new(field, format!("must be a string, not {}", kind(v))));
                    };
                    out.push((k.clone(), v.clone()));
                }
                out
            }
            Some(other) => {
                let problem = format!("must be an object of strings, not {}", kind(other));
                return Err(EnvelopeError::new("message.attributes", problem));
            }
        };
        let publish_time = either_str(message, "publishTime", "publish_time", "message.")?.map(str::to_string);
        if let Some(key) = either_str(message, "orderingKey", "ordering_key", "message.")?.filter(|k| !k.is_empty()) {
            attributes.push(("ordering_key".into(), key.to_string()));
        }
        Ok(Incoming { data, attributes, message_id, publish_time, delivery_attempt })
    }
}

/// Where an unwrapped push writes the message's id (with `write_metadata`).
const MESSAGE_ID_HEADER: &str = "x-goog-pubsub-message-id";
/// … its publish time.
const PUBLISH_TIME_HEADER: &str = "x-goog-pubsub-publish-time";
/// … its ordering key (without `pubsub` in the name, as the emulator writes it).
const ORDERING_KEY_HEADER: &str = "x-goog-ordering-key";

/// The message of an unwrapped push (`--push-no-wrapper`): the body is its data. With
/// `--push-no-wrapper-write-metadata` its id, publish time and ordering key come as
/// `x-goog-…` headers, and each attribute as a header of its own name, of which the
/// route's `attributes` are kept (under the names the route writes). Without metadata
/// the message is named by its body, `body-sha256:<hex>`: Pub/Sub's redelivery of it
/// is a duplicate, and so is another message with the same data. A header Inlet reads
/// that is sent twice, or is not UTF-8, refuses the request.
pub fn unwrapped_message(headers: &HeaderMap, body: &[u8], attributes: &[String]) -> Result<Incoming, EnvelopeError> {
    let one = |name: &str| -> Result<Option<String>, EnvelopeError> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else { return Ok(None) };
        let field = format!("header {}", name.to_ascii_lowercase());
        if values.next().is_some() {
            return Err(EnvelopeError::new(field, "appears twice"));
        }
        let text = std::str::from_utf8(value.as_bytes()).map_err(|_| EnvelopeError::new(&field, "is not UTF-8"))?;
        Ok(Some(text.to_string()))
    };
    let message_id = match one(MESSAGE_ID_HEADER)? {
        Some(id) if id.trim().is_empty() => {
            return Err(EnvelopeError::new("header x-goog-pubsub-message-id", "is empty"));
        }
        Some(id) => id,
        None => format!("body-sha256:{}", crate::inbox::digest_hex(body)),
    };
    let mut kept = Vec::with_capacity(attributes.len() + 1);
    for name in attributes {
        if let Some(value) = one(name)? {
            kept.push((name.clone(), value));
        }
    }
    if let Some(key) = one(ORDERING_KEY_HEADER)?.filter(|k| !k.is_empty()) {
        kept.push(("ordering_key".into(), key));
    }
    Ok(Incoming {
        data: body.to_vec(),
        attributes: kept,
        message_id,
        publish_time: one(PUBLISH_TIME_HEADER)?,
        delivery_attempt: None,
    })
}

/// The answer to an accepted push (200): the entry that holds the message and what
/// became of it; `conflict_of` names the entry whose dedup key a conflicting payload
/// reused.
#[derive(Debug, serde::Serialize)]
pub struct PushAnswer {
    pub entry: i64,
    pub outcome: Stored,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict_of: Option<i64>,
}

impl From<Accepted> for PushAnswer {
    fn from(a: Accepted) -> PushAnswer {
        let conflict_of = match a.outcome {
            InsertOutcome::Conflict { existing, .. } => Some(existing),
            _ => None,
        };
        PushAnswer { entry: a.outcome.id(), outcome: a.stored, conflict_of }
    }
}

/// A push that was not acked: `{"error": "…", "reason": "…"}`, the reason one of a
/// fixed set (API.md lists them; each is the `reason` label of
/// `inlet_push_rejected_total`, push auth's of `inlet_push_auth_refused_total`).
/// Pub/Sub redelivers every one of them.
#[derive(Debug)]
pub struct PushError {
    pub status: StatusCode,
    pub reason: &'static str,
    pub error: String,
}

impl PushError {
    fn new(status: StatusCode, reason: &'static str, error: impl Into<String>) -> PushError {
        PushError { status, reason, error: error.into() }
    }
}

impl IntoResponse for PushError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.error, "reason": self.reason }))).into_response()
    }
}

/// Whether a request's `Content-Type` is JSON (`application/json`, any parameters).
/// Pub/Sub sends exactly that. Anything else — a form, plain text, or none at all — is
/// refused: a web page can make a browser send those cross-site without asking
/// first, and a push route on loopback must not take messages from any page a
/// developer opens (SECURITY.md).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// What a push request reaches: the routes serving now, the receiving half, the
/// push-auth keys and the metrics (taken from the instance's state by `FromRef`).
#[derive(Clone)]
pub struct PushState {
    pub routes: Arc<RouteTable>,
    pub ingest: Arc<Ingest>,
    pub verifier: Arc<Verifier>,
    pub metrics: Arc<Metrics>,
}

/// Counts a refused push in `inlet_push_rejected_total` (by route, `-` for a name no
/// routing file declares, and reason) and passes the refusal on.
fn refused(shared: &PushState, route: &str, error: PushError) -> PushError {
    let known = shared.routes.get().get(route).is_some() || shared.routes.get().refusal(route).is_some();
    let label = RouteReason { route: if known { route } else { "-" }.to_string(), reason: error.reason };
    shared.metrics.push_rejected.get_or_create(&label).inc();
    error
}

/// The route's push auth ([`super::push_auth`]): a refusal is counted and logged.
async fn check_push_auth(
    shared: &PushState,
    route: &str,
    headers: &HeaderMap,
    rule: &OidcPush,
) -> Result<(), PushError> {
    let Err(refused) = shared.verifier.verify(headers, rule).await else { return Ok(()) };
    let label = RouteReason { route: route.to_string(), reason: refused.as_str() };
    shared.metrics.push_auth_refused.get_or_create(&label).inc();
    tracing::warn!(route, reason = refused.as_str(), "push request refused by push auth");
    let error = format!("push auth: {}", refused.as_str());
    Err(PushError::new(refused.status(), refused.as_str(), error))
}

pub async fn handle(
    State(shared): State<PushState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<PushAnswer>, PushError> {
    let Ok(Path(route)) = path else {
        // Not UTF-8 once percent-decoded, or more than one segment: no route has such a name.
        let error = PushError::new(StatusCode::NOT_FOUND, "no_route", "the path names no route");
        return Err(refused(&shared, "-", error));
    };
    let routes = shared.routes.get();
    let Some(found) = routes.get(&route) else {
        // A refused route answers 503, so Pub/Sub redelivers once it is fixed: only
        // once the request passes the route's push auth, and without the reason (it
        // quotes the routing file; admin tokens read it in `GET /api/routes`).
        if let Some(p) = routes.refusal(&route) {
            if let Some(PushAuth::Oidc(rule)) = p.push_auth.as_deref() {
                check_push_auth(&shared, &route, &headers, rule).await?;
            }
            let error = format!("route `{route}` is refused by the routing configuration; the message was not taken");
            return Err(refused(
                &shared,
                &route,
                PushError::new(StatusCode::SERVICE_UNAVAILABLE, "route_refused", error),
            ));
        }
        let error =
            PushError::new(StatusCode::NOT_FOUND, "no_route", format!("no route named `{}`", shown_key(&route)));
        return Err(refused(&shared, &route, error));
    };
    // A pull route takes no pushes.
    let Some(route) = Some(found).filter(|r| matches!(r.config.source, SourceConfig::Push(_))) else {
        let error = PushError::new(StatusCode::NOT_FOUND, "no_route", format!("no push route named `{route}`"));
        return Err(refused(&shared, &route, error));
    };
    if let Some(PushAuth::Oidc(rule)) = &route.config.push_auth {
        check_push_auth(&shared, route.name(), &headers, rule).await?;
    }
    let unwrapped = match &route.config.source {
        SourceConfig::Push(push) => push.unwrapped.as_ref(),
        SourceConfig::Pubsub(_) | SourceConfig::Outbox(_) => None,
    };
    if unwrapped.is_none() && !is_json(&headers) {
        let sent = headers.get(header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let sent = sent.map_or("none".to_string(), |v| format!("`{}`", shown_key(&v)));
        tracing::warn!(route = route.name(), content_type = %sent, "rejected a push request that is not JSON");
        let error = format!("a push body must be sent as `Content-Type: application/json` (this one: {sent})");
        return Err(refused(
            &shared,
            route.name(),
            PushError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "not_json", error),
        ));
    }
    let parsed = match unwrapped {
        Some(u) => unwrapped_message(&headers, &body, &u.attributes),
        None => PushEnvelope::parse(&body),
    };
    let incoming = match parsed {
        Ok(i) => i,
        Err(error) => {
            tracing::warn!(route = route.name(), field = %error.field, %error, "rejected a push request");
            let error = PushError::new(StatusCode::BAD_REQUEST, "bad_envelope", error.to_string());
            return Err(refused(&shared, route.name(), error));
        }
    };
    match shared.ingest.accept(route, incoming).await {
        Ok(accepted) => Ok(Json(accepted.into())),
        Err(error) => {
            let reason = match error {
                IngestError::Store(_) => "store_unavailable",
                IngestError::PluginBusy(_) => "plugin_busy",
                IngestError::FetchBusy(_) => "fetch_unavailable",
            };
            let error = PushError::new(StatusCode::SERVICE_UNAVAILABLE, reason, error.to_string());
            Err(refused(&shared, route.name(), error))
        }
    }
}

/// The listener's limits for `/push`, shared by every push request (the state of
/// [`limit`]).
#[derive(Clone)]
pub struct Limits {
    shared: PushState,
    permits: Arc<Semaphore>,
    max_in_flight: usize,
    max_body: usize,
    timeout: Duration,
}

impl Limits {
    pub fn new(shared: PushState, server: &ServerConfig) -> Limits {
        Limits {
            shared,
            permits: Arc::new(Semaphore::new(server.max_concurrent_pushes)),
            max_in_flight: server.max_concurrent_pushes,
            max_body: server.max_body_bytes,
            timeout: server.request_timeout,
        }
    }

    /// Counts a refused request and builds its answer.
    fn reject(&self, route: &str, reason: Rejection) -> Response {
        // Only names of configured routes become labels: the path is the sender's.
        let known = self.shared.routes.get().get(route).is_some();
        let label = RouteReason { route: if known { route } else { "-" }.to_string(), reason: reason.label() };
        self.shared.metrics.push_rejected.get_or_create(&label).inc();
        tracing::warn!(route, reason = reason.label(), "refused a push request: {}", reason.message(self));
        let mut response = PushError::new(reason.status(), reason.label(), reason.message(self)).into_response();
        if reason.status() == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        if matches!(reason, Rejection::TooLarge | Rejection::BodyTimeout) {
            // The rest of the body is not read: the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Why [`limit`] refused a push request.
#[derive(Debug, Clone, Copy)]
enum Rejection {
    Shed,
    TooLarge,
    BodyTimeout,
    Timeout,
}

impl Rejection {
    fn label(self) -> &'static str {
        match self {
            Rejection::Shed => "shed",
            Rejection::TooLarge => "too_large",
            Rejection::BodyTimeout => "body_timeout",
            Rejection::Timeout => "timeout",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Rejection::Shed | Rejection::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn message(self, limits: &Limits) -> String {
        match self {
            Rejection::Shed => format!(
                "too many push requests in flight (max_concurrent_pushes = {}); retry later",
                limits.max_in_flight
            ),
            Rejection::TooLarge => format!("the body is larger than max_body_mib ({} bytes)", limits.max_body),
            Rejection::BodyTimeout => {
                format!(
                    "the body did not arrive within request_timeout ({})",
                    humantime::format_duration(limits.timeout)
                )
            }
            Rejection::Timeout => format!(
                "the request did not finish within request_timeout ({}); nothing was acked",
                humantime::format_duration(limits.timeout)
            ),
        }
    }
}

/// Holds one of `max_concurrent_pushes` permits and shows it in `inlet_push_in_flight`.
struct InFlight<'a> {
    gauge: &'a prometheus_client::metrics::gauge::Gauge,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Middleware in front of [`handle`]: sheds, bounds the body and the time (see the
/// module doc). The body is read here, so the handler gets it whole.
pub async fn limit(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    // The route as the path spells it (only names of configured routes become labels).
    let route = request.uri().path().strip_prefix("/push/").unwrap_or_default().to_string();
    let Ok(permit) = Arc::clone(&limits.permits).try_acquire_owned() else {
        return limits.reject(&route, Rejection::Shed);
    };
    limits.shared.metrics.push_in_flight.inc();
    let _in_flight = InFlight { gauge: &limits.shared.metrics.push_in_flight, _permit: permit };
    let deadline = Instant::now() + limits.timeout;

    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return limits.reject(&route, Rejection::TooLarge);
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout_at(deadline, Limited::new(body, limits.max_body).collect()).await {
        Err(_) => return limits.reject(&route, Rejection::BodyTimeout),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return limits.reject(&route, Rejection::TooLarge),
        Ok(Err(e)) => {
            tracing::warn!(route, error = %e, "a push request's body broke off");
            let error = format!("cannot read the body: {e}");
            return PushError::new(StatusCode::BAD_REQUEST, "unreadable_body", error).into_response();
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout_at(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => limits.reject(&route, Rejection::Timeout),
    }
}
