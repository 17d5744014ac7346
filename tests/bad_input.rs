//! The bad-input corpus: requests a stranger, a broken sender or a buggy
//! plugin can produce, each with the outcome a client and an operator see — the HTTP
//! status, the error object (`{"error", "reason"}` for pushes, `{"error"}` for the
//! admin API), the row left in the inbox (none; OPEN; PARKED with the raw payload and
//! a reason naming the problem; IGNORED) and the counter that counted it — on a real
//! SQLite file and a real PostgreSQL database, through a real listener, with the real
//! compiled plugins (`work_order`, `hostile`, `unruly`, `future_contract`).
//!
//! Nothing is lost: every accepted push has its row, every refused one was refused
//! with a non-2xx answer (so the sender retries) and left no row. Broken routing
//! files and team files (not UTF-8, a BOM, empty, binary) are at the end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use inlet::app::{self, Running};
use inlet::config::Config;
use inlet::inbox::{Entry, ListFilter, Status, Store};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Inlet on a store
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Sqlite,
    Postgres,
}

struct Inlet {
    running: Option<Running>,
    base: String,
    store: Arc<dyn Store>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _pg: Option<TestPg>,
}

/// The routes of the corpus: `wo` (the work-order plugin), `hostile` (misbehaves on
/// command, tight limits), `unruly` (answers that break the output rules), `pulled`
/// (a pull route: takes no pushes), `future` (a plugin built for another contract:
/// refused). Bodies are capped at 1 MiB.
fn routing_file(store_url: &str) -> String {
    let route = |name: &str, plugin: &str, source: &str, extra: &str| {
        format!(
            "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {source}\ntarget = {{ kind = \"log\" }}\n{extra}\n",
            plugin_path(plugin).display()
        )
    };
    [
        format!("[store]\nurl = \"{store_url}\"\n\n[server]\nmax_body_mib = 1\n\n[admin]\nauth = \"none-loopback\"\n"),
        route("wo", "work_order", "{ kind = \"push\" }", ""),
        route(
            "hostile",
            "hostile",
            "{ kind = \"push\" }",
            "limits = { call_timeout = \"4s\", timeout_tries = 2, fuel = 20000000, memory_mib = 64, max_output_mib = 1 }",
        ),
        route("unruly", "unruly", "{ kind = \"push\" }", ""),
        route("pulled", "work_order", "{ kind = \"pubsub\", subscription = \"projects/p/subscriptions/s\" }", ""),
        route("future", "future_contract", "{ kind = \"push\" }", ""),
    ]
    .join("\n")
}

impl Inlet {
    async fn start(backend: Backend) -> Inlet {
        inlet::telemetry::init_logging();
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
            Backend::Postgres => {
                let pg = TestPg::new().await;
                (pg.url.clone(), Some(pg))
            }
        };
        let path = dir.path().join("inlet.toml");
        std::fs::write(&path, routing_file(&url)).unwrap();
        let config = Config::load_partial(&path).unwrap_or_else(|e| panic!("the corpus routing file is invalid:\n{e}"));
        let options = app::Options {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            poll: Duration::from_millis(20),
            reload_every: None,
            // The pull route's broker: a port nobody listens on (it keeps reconnecting).
            pubsub: inlet::pubsub_client::Connection::emulator(&format!("127.0.0.1:{}", free_port())),
            ..app::Options::default()
        };
        let running = app::start(&config, options).await.expect("inlet starts");
        let base = format!("http://{}", running.addr);
        let store = Arc::clone(&running.shared.store);
        Inlet { running: Some(running), base, store, http: reqwest::Client::new(), _dir: dir, _pg: pg }
    }

    async fn rows_after(&self, after: i64) -> Vec<Entry> {
        let filter = ListFilter { after_id: Some(after), limit: 1000, ..ListFilter::default() };
        self.store.list(&filter).await.expect("list the inbox")
    }

    /// A counter's value in `/metrics` (0 when it has no sample yet).
    async fn counter(&self, sample: &str) -> u64 {
        let text = self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
        let prefix = format!("{sample} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse::<f64>().unwrap_or_else(|_| panic!("{sample}: {v}")) as u64)
    }
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

/// A request as sent: method, path (and query), headers, body. `@name@` in the path
/// is replaced by the entry of the case called `name`.
#[derive(Clone)]
struct Req {
    method: &'static str,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Sent by hand: only the head, declaring a body of this many bytes that never
    /// comes (what a refusal by declared size sees, without a race on the rest).
    declared: Option<usize>,
}

impl Req {
    fn new(method: &'static str, path: impl Into<String>) -> Req {
        Req { method, path: path.into(), headers: Vec::new(), body: Vec::new(), declared: None }
    }

    fn json(mut self, body: impl Into<Vec<u8>>) -> Req {
        self.headers.push(("content-type".into(), b"application/json".to_vec()));
        self.body = body.into();
        self
    }

    fn header(mut self, name: &str, value: &[u8]) -> Req {
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.into(), value.to_vec()));
        self
    }

    fn without(mut self, name: &str) -> Req {
        self.headers.retain(|(n, _)| n != name);
        self
    }
}

/// What the answer must be.
#[derive(Clone, Debug)]
enum Answer {
    /// 200 `{"entry", "outcome"}` with this outcome.
    Outcome(&'static str),
    /// An error object: status, the push `reason` (if the case is a push refusal) and
    /// a text the `error` must contain.
    Refused(u16, Option<&'static str>, &'static str),
    /// A 2xx JSON answer of the admin API.
    Json(u16),
    /// Refused by the HTTP layer itself before any handler: a status, any body.
    Bare(u16),
    /// Like `Bare`, or the connection cut before the answer could be read (the server
    /// stopped reading a request it refused; a sender sees a failure and retries).
    Cut(u16),
}

/// What the inbox must hold afterwards.
#[derive(Clone, Debug)]
enum Row {
    /// No new row.
    None,
    /// One new row that will be delivered (OPEN, IN_PROGRESS or already DONE), with
    /// this correlation key and the data sent.
    Open(&'static str),
    /// One new PARKED row with the data sent; its error contains the text.
    Parked(&'static str),
    /// One new IGNORED row with the data sent; its reason contains the text.
    Ignored(&'static str),
    /// One new PARKED row with the data sent, the conflict of the named case's entry.
    Conflict(&'static str),
    /// No new row; the answer names the named case's entry.
    Duplicate(&'static str),
    /// One new row with the data sent, in whatever state this backend puts it (the two
    /// differ only in what their text columns can hold); `last_error` says why if parked.
    Stored,
    /// No new row, and the named case's entry is still in this state.
    Keeps(&'static str, Status),
}

struct Case {
    name: &'static str,
    req: Req,
    /// The message data the row must hold (pushes that are stored).
    sent: Vec<u8>,
    answer: Answer,
    row: Row,
    /// A counter sample (`name{labels}`) that must go up by one.
    counted: Option<String>,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn work_order(key: &str, items: u32) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":{items},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#)
        .into_bytes()
}

fn envelope(data: &[u8], attributes: Value, id: &str) -> Value {
    json!({ "message": { "data": b64(data), "attributes": attributes, "messageId": id }, "subscription": "projects/p/subscriptions/s" })
}

fn ingested(route: &str, outcome: &str) -> Option<String> {
    Some(format!("inlet_ingested_total{{route=\"{route}\",outcome=\"{outcome}\"}}"))
}

fn rejected(route: &str, reason: &str) -> Option<String> {
    Some(format!("inlet_push_rejected_total{{route=\"{route}\",reason=\"{reason}\"}}"))
}

fn rule_refused(route: &str, rule: &str) -> Option<String> {
    Some(format!("inlet_plugin_output_refused_total{{route=\"{route}\",call=\"decode\",rule=\"{rule}\"}}"))
}

/// A push of a well-formed envelope carrying `data`.
fn push(
    name: &'static str,
    route: &str,
    data: &[u8],
    id: &str,
    answer: Answer,
    row: Row,
    counted: Option<String>,
) -> Case {
    let req = Req::new("POST", format!("/push/{route}")).json(envelope(data, json!({}), id).to_string());
    Case { name, req, sent: data.to_vec(), answer, row, counted }
}

/// A push whose body is not a usable envelope: 400 `bad_envelope`, no row, counted.
fn bad_envelope(name: &'static str, body: impl Into<Vec<u8>>, says: &'static str) -> Case {
    Case {
        name,
        req: Req::new("POST", "/push/wo").json(body),
        sent: Vec::new(),
        answer: Answer::Refused(400, Some("bad_envelope"), says),
        row: Row::None,
        counted: rejected("wo", "bad_envelope"),
    }
}

/// An envelope around a message object given as JSON text.
fn with_message(message: &str) -> String {
    format!(r#"{{"message": {message}, "subscription": "projects/p/subscriptions/s"}}"#)
}

/// A request that must change nothing: no row, the answer as given.
fn refused(name: &'static str, req: Req, answer: Answer) -> Case {
    Case { name, req, sent: Vec::new(), answer, row: Row::None, counted: None }
}

/// A push with a valid envelope sent with another content type (or none): 415.
fn not_json(name: &'static str, content_type: Option<&[u8]>, id: &str) -> Case {
    let req = Req::new("POST", "/push/wo").json(envelope(&work_order("ct", 1), json!({}), id).to_string());
    let req = match content_type {
        Some(ct) => req.header("content-type", ct),
        None => req.without("content-type"),
    };
    Case {
        name,
        req,
        sent: Vec::new(),
        answer: Answer::Refused(415, Some("not_json"), "application/json"),
        row: Row::None,
        counted: rejected("wo", "not_json"),
    }
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// A payload whose standard base64 holds both `+` and `/`, so its URL-safe spelling differs.
fn base64_sensitive() -> Vec<u8> {
    let data = work_order("b64~~~?>?>", 7);
    let standard = b64(&data);
    assert!(standard.contains('+') || standard.contains('/'), "the payload must exercise the alphabets: {standard}");
    data
}

fn corpus() -> Vec<Case> {
    use Answer::{Bare, Cut, Json, Outcome, Refused};
    let mut cases = vec![
        // --- the baseline: a good message, then the same again and its twins ---------
        push(
            "good",
            "wo",
            &work_order("4711", 1),
            "m-good",
            Outcome("inserted"),
            Row::Open("4711"),
            ingested("wo", "inserted"),
        ),
        push(
            "good again",
            "wo",
            &work_order("4711", 1),
            "m-good",
            Outcome("duplicate"),
            Row::Duplicate("good"),
            ingested("wo", "duplicate"),
        ),
        push(
            "same message id, other body",
            "wo",
            &work_order("4711", 2),
            "m-good",
            Outcome("conflict"),
            Row::Conflict("good"),
            ingested("wo", "conflict"),
        ),
        push(
            "that conflict again",
            "wo",
            &work_order("4711", 2),
            "m-good",
            Outcome("duplicate"),
            Row::Duplicate("same message id, other body"),
            ingested("wo", "duplicate"),
        ),
        Case {
            name: "same event id attribute, other message and body",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("4712", 1), json!({"eventId": "evt-1"}), "m-evt-1").to_string()),
            sent: work_order("4712", 1),
            answer: Outcome("inserted"),
            row: Row::Open("4712"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "event id reused by another message",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("4712", 9), json!({"eventId": "evt-1"}), "m-evt-2").to_string()),
            sent: work_order("4712", 9),
            answer: Outcome("conflict"),
            row: Row::Conflict("same event id attribute, other message and body"),
            counted: Some("inlet_dedup_conflicts_total{route=\"wo\"}".into()),
        },
        // --- bodies that are not JSON, or not an object --------------------------------
        bad_envelope("empty body", "", "`body` is not JSON"),
        bad_envelope("plain text body", "hello", "`body` is not JSON"),
        bad_envelope("truncated JSON", r#"{"message": {"data""#, "`body` is not JSON"),
        bad_envelope("trailing garbage", format!("{} x", envelope(b"x", json!({}), "m-tg")), "`body` is not JSON"),
        bad_envelope("JSON null", "null", "`body` must be a JSON object, not null"),
        bad_envelope("JSON array", "[]", "`body` must be a JSON object, not an array"),
        bad_envelope("JSON string", "\"message\"", "`body` must be a JSON object, not a string"),
        bad_envelope("JSON number", "42", "`body` must be a JSON object, not a number"),
        bad_envelope(
            "invalid UTF-8 in a string",
            b"{\"message\": {\"messageId\": \"m-\xff\xfe\"}}".to_vec(),
            "`body` is not JSON",
        ),
        bad_envelope("a lone surrogate escape", r#"{"message": {"messageId": "m-\ud800"}}"#, "`body` is not JSON"),
        bad_envelope(
            "a UTF-8 BOM before the JSON",
            [b"\xef\xbb\xbf".as_slice(), envelope(b"x", json!({}), "m-bom").to_string().as_bytes()].concat(),
            "`body` is not JSON",
        ),
        bad_envelope(
            "raw control character in a string",
            b"{\"message\": {\"messageId\": \"m-\x01\"}}".to_vec(),
            "`body` is not JSON",
        ),
        bad_envelope(
            "NUL byte in the body",
            b"{\"message\": {\"messageId\": \"m\x00\"}}".to_vec(),
            "`body` is not JSON",
        ),
        bad_envelope(
            "recursion bomb in an unused field",
            format!(r#"{{"message": {{"messageId": "m-deep"}}, "x": {}}}"#, nested(100_000)),
            "recursion limit exceeded",
        ),
        bad_envelope(
            "recursion bomb of objects as the message",
            format!(r#"{{"message": {}}}"#, "{\"a\":".repeat(50_000)),
            "recursion limit exceeded",
        ),
        // --- JSON of the wrong shape ----------------------------------------------------
        bad_envelope("no message", "{}", "`message` is missing"),
        bad_envelope("message null", r#"{"message": null}"#, "`message` is missing"),
        bad_envelope("message a string", r#"{"message": "hello"}"#, "`message` must be an object, not a string"),
        bad_envelope("message an array", r#"{"message": []}"#, "`message` must be an object, not an array"),
        bad_envelope("message without id", with_message(r#"{"data": "eA=="}"#), "`message.messageId` is missing"),
        bad_envelope("empty message id", with_message(r#"{"messageId": ""}"#), "`message.messageId` is empty"),
        bad_envelope(
            "message id a number",
            with_message(r#"{"messageId": 5}"#),
            "`message.messageId` must be a string, not a number",
        ),
        bad_envelope(
            "snake message id a boolean",
            with_message(r#"{"message_id": true}"#),
            "`message.message_id` must be a string, not a boolean",
        ),
        bad_envelope(
            "data a number",
            with_message(r#"{"messageId": "m", "data": 12}"#),
            "`message.data` must be a string, not a number",
        ),
        bad_envelope(
            "data an object",
            with_message(r#"{"messageId": "m", "data": {"a": 1}}"#),
            "`message.data` must be a string, not an object",
        ),
        bad_envelope(
            "data not base64",
            with_message(r#"{"messageId": "m", "data": "!!!!"}"#),
            "`message.data` is not base64",
        ),
        bad_envelope(
            "data base64 with a line break",
            with_message(r#"{"messageId": "m", "data": "eyJh\nIjox"}"#),
            "`message.data` is not base64",
        ),
        bad_envelope(
            "data with nonzero trailing bits",
            with_message(r#"{"messageId": "m", "data": "QR=="}"#),
            "`message.data` is not base64",
        ),
        bad_envelope(
            "data mixing both alphabets",
            with_message(r#"{"messageId": "m", "data": "ab+-"}"#),
            "`message.data` is not base64",
        ),
        bad_envelope(
            "data too much padding",
            with_message(r#"{"messageId": "m", "data": "QQ===="}"#),
            "`message.data` is not base64",
        ),
        bad_envelope(
            "attributes an array",
            with_message(r#"{"messageId": "m", "attributes": [["a", "b"]]}"#),
            "`message.attributes` must be an object of strings, not an array",
        ),
        bad_envelope(
            "attributes a string",
            with_message(r#"{"messageId": "m", "attributes": "a=b"}"#),
            "`message.attributes` must be an object of strings, not a string",
        ),
        bad_envelope(
            "attribute value a number",
            with_message(r#"{"messageId": "m", "attributes": {"eventId": 7}}"#),
            "`message.attributes.eventId` must be a string, not a number",
        ),
        bad_envelope(
            "attribute value null",
            with_message(r#"{"messageId": "m", "attributes": {"eventId": null}}"#),
            "`message.attributes.eventId` must be a string, not null",
        ),
        bad_envelope(
            "publish time a number",
            with_message(r#"{"messageId": "m", "publishTime": 1785000000}"#),
            "`message.publishTime` must be a string, not a number",
        ),
        bad_envelope(
            "subscription a number",
            r#"{"message": {"messageId": "m"}, "subscription": 3}"#,
            "`subscription` must be a string, not a number",
        ),
        bad_envelope(
            "delivery attempt a string",
            r#"{"message": {"messageId": "m"}, "deliveryAttempt": "3"}"#,
            "`deliveryAttempt` must be a number, not a string",
        ),
        bad_envelope(
            "delivery attempt negative",
            r#"{"message": {"messageId": "m"}, "deliveryAttempt": -1}"#,
            "`deliveryAttempt` must be a whole number",
        ),
        bad_envelope(
            "delivery attempt a fraction",
            r#"{"message": {"messageId": "m"}, "deliveryAttempt": 1.5}"#,
            "`deliveryAttempt` must be a whole number",
        ),
        bad_envelope(
            "delivery attempt past u32",
            r#"{"message": {"messageId": "m"}, "deliveryAttempt": 1099511627776}"#,
            "`deliveryAttempt` must be a whole number",
        ),
        // --- content types: only JSON (a browser can post the others cross-site) ----------
        not_json("no content type", None, "m-ct-1"),
        not_json("plain text content type", Some(b"text/plain"), "m-ct-2"),
        not_json("form content type", Some(b"application/x-www-form-urlencoded"), "m-ct-3"),
        not_json("multipart content type", Some(b"multipart/form-data; boundary=x"), "m-ct-4"),
        not_json("json lookalike content type", Some(b"application/jsonx"), "m-ct-5"),
        not_json("json patch content type", Some(b"application/json-patch+json"), "m-ct-6"),
        not_json("content type not ASCII", Some(b"application/json\xff"), "m-ct-7"),
        Case {
            name: "json content type with charset",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("ct-ok", 1), json!({}), "m-ct-8").to_string())
                .header("content-type", b"application/json; charset=utf-8"),
            sent: work_order("ct-ok", 1),
            answer: Outcome("inserted"),
            row: Row::Open("ct-ok"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "json content type in capitals",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("ct-caps", 1), json!({}), "m-ct-9").to_string())
                .header("content-type", b"APPLICATION/JSON"),
            sent: work_order("ct-caps", 1),
            answer: Outcome("inserted"),
            row: Row::Open("ct-caps"),
            counted: ingested("wo", "inserted"),
        },
        // --- routes, paths and methods --------------------------------------------------
        Case {
            name: "unknown route",
            req: Req::new("POST", "/push/nope").json(envelope(b"x", json!({}), "m-r1").to_string()),
            sent: Vec::new(),
            answer: Refused(404, Some("no_route"), "no route named `nope`"),
            row: Row::None,
            counted: rejected("-", "no_route"),
        },
        Case {
            name: "route name with a NUL",
            req: Req::new("POST", "/push/w%00o").json(envelope(b"x", json!({}), "m-r2").to_string()),
            sent: Vec::new(),
            answer: Refused(404, Some("no_route"), "no route named `w\\0o`"),
            row: Row::None,
            counted: rejected("-", "no_route"),
        },
        Case {
            name: "route name not UTF-8",
            req: Req::new("POST", "/push/%FF%FE").json(envelope(b"x", json!({}), "m-r3").to_string()),
            sent: Vec::new(),
            answer: Refused(404, Some("no_route"), "the path names no route"),
            row: Row::None,
            counted: rejected("-", "no_route"),
        },
        Case {
            name: "route name of 8 KiB",
            req: Req::new("POST", format!("/push/{}", "r".repeat(8192)))
                .json(envelope(b"x", json!({}), "m-r4").to_string()),
            sent: Vec::new(),
            answer: Refused(404, Some("no_route"), "no route named `rrrr"),
            row: Row::None,
            counted: rejected("-", "no_route"),
        },
        Case {
            name: "a pull route",
            req: Req::new("POST", "/push/pulled").json(envelope(&work_order("p", 1), json!({}), "m-r5").to_string()),
            sent: Vec::new(),
            answer: Refused(404, Some("no_route"), "no push route named `pulled`"),
            row: Row::None,
            counted: rejected("pulled", "no_route"),
        },
        Case {
            name: "a refused route",
            req: Req::new("POST", "/push/future").json(envelope(&work_order("f", 1), json!({}), "m-r6").to_string()),
            sent: Vec::new(),
            answer: Refused(503, Some("route_refused"), "route `future` is refused"),
            row: Row::None,
            counted: rejected("future", "route_refused"),
        },
        refused(
            "a path below a route",
            Req::new("POST", "/push/wo/extra").json(envelope(b"x", json!({}), "m-r7").to_string()),
            Refused(404, None, "no endpoint /push/wo/extra"),
        ),
        refused(
            "push without a route",
            Req::new("POST", "/push/").json(envelope(b"x", json!({}), "m-r8").to_string()),
            Refused(404, None, "no endpoint /push/"),
        ),
        refused("GET on a push route", Req::new("GET", "/push/wo"), Refused(405, None, "does not take GET")),
        refused(
            "PUT on a push route",
            Req::new("PUT", "/push/wo").json(envelope(b"x", json!({}), "m-r9").to_string()),
            Refused(405, None, "does not take PUT"),
        ),
        refused("DELETE on a push route", Req::new("DELETE", "/push/wo"), Refused(405, None, "does not take DELETE")),
        refused(
            "a CORS preflight",
            Req::new("OPTIONS", "/push/wo")
                .header("origin", b"https://evil.example")
                .header("access-control-request-method", b"POST"),
            // A page's request: Origin is refused before the method is looked at.
            Refused(403, Some("origin"), "Origin"),
        ),
        refused("an unknown path", Req::new("GET", "/nothing/here"), Refused(404, None, "no endpoint /nothing/here")),
        refused(
            "an unknown API path",
            Req::new("POST", "/api/nothing"),
            Refused(404, None, "no endpoint /api/nothing"),
        ),
        Case {
            name: "a query string on a push",
            req: Req::new("POST", "/push/wo?token=abc&x=%00")
                .json(envelope(&work_order("q", 1), json!({}), "m-q").to_string()),
            sent: work_order("q", 1),
            answer: Outcome("inserted"),
            row: Row::Open("q"),
            counted: ingested("wo", "inserted"),
        },
        // --- sizes and headers ----------------------------------------------------------
        Case {
            name: "a body over max_body_mib",
            req: Req { declared: Some(2 << 20), ..Req::new("POST", "/push/wo").json("") },
            sent: Vec::new(),
            answer: Refused(413, Some("too_large"), "max_body_mib"),
            row: Row::None,
            counted: rejected("wo", "too_large"),
        },
        Case {
            name: "a 32 KiB header",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("hdr", 1), json!({}), "m-hdr").to_string())
                .header("x-filler", "h".repeat(32 << 10).as_bytes()),
            sent: work_order("hdr", 1),
            answer: Outcome("inserted"),
            row: Row::Open("hdr"),
            counted: ingested("wo", "inserted"),
        },
        refused(
            "a 1 MiB header",
            Req::new("POST", "/push/wo")
                .json(envelope(&work_order("hdr", 2), json!({}), "m-hdr-2").to_string())
                .header("x-filler", "h".repeat(1 << 20).as_bytes()),
            Cut(431),
        ),
        refused(
            "too many headers",
            {
                let mut r = Req::new("POST", "/push/wo").json("");
                for i in 0..200 {
                    r = r.header(&format!("x-h-{i}"), b"1");
                }
                r
            },
            Bare(431),
        ),
        // --- the message data: empty, odd spellings, what the plugin cannot read --------
        Case {
            name: "no data at all",
            req: Req::new("POST", "/push/wo").json(with_message(r#"{"messageId": "m-nodata"}"#)),
            sent: Vec::new(),
            answer: Outcome("parked"),
            row: Row::Parked("payload is not a work-order-completed event"),
            counted: ingested("wo", "parked"),
        },
        Case {
            name: "data empty",
            req: Req::new("POST", "/push/wo").json(with_message(r#"{"messageId": "m-empty", "data": ""}"#)),
            sent: Vec::new(),
            answer: Outcome("parked"),
            row: Row::Parked("payload is not a work-order-completed event"),
            counted: ingested("wo", "parked"),
        },
        Case {
            name: "data null, attributes null, snake case",
            req: Req::new("POST", "/push/wo").json(with_message(
                r#"{"message_id": "m-null", "data": null, "attributes": null, "publish_time": null}"#,
            )),
            sent: Vec::new(),
            answer: Outcome("parked"),
            row: Row::Parked("payload is not a work-order-completed event"),
            counted: ingested("wo", "parked"),
        },
        push(
            "data not UTF-8",
            "wo",
            b"\xff\xfe\x00garbage\x80",
            "m-bin",
            Outcome("parked"),
            Row::Parked("payload is not a work-order-completed event"),
            ingested("wo", "parked"),
        ),
        push(
            "data not JSON",
            "wo",
            b"not a work order",
            "m-text",
            Outcome("parked"),
            Row::Parked("payload is not a work-order-completed event"),
            ingested("wo", "parked"),
        ),
        push(
            "data JSON of another shape",
            "wo",
            br#"{"workOrderId": 4711}"#,
            "m-shape",
            Outcome("parked"),
            Row::Parked("invalid type"),
            ingested("wo", "parked"),
        ),
        push(
            "data with a negative count",
            "wo",
            br#"{"workOrderId":"n","completedItems":-3,"completionTimestamp":"t"}"#,
            "m-neg",
            Outcome("parked"),
            Row::Parked("invalid value"),
            ingested("wo", "parked"),
        ),
        push(
            "data with an empty key",
            "wo",
            br#"{"workOrderId":"  ","completedItems":1,"completionTimestamp":"t"}"#,
            "m-blank",
            Outcome("parked"),
            Row::Parked("workOrderId is empty"),
            ingested("wo", "parked"),
        ),
        push(
            "data with a NUL in the key",
            "wo",
            br#"{"workOrderId":"a\u0000b","completedItems":1,"completionTimestamp":"t"}"#,
            "m-nulkey",
            Outcome("parked"),
            Row::Parked("correlation-key.control-char"),
            rule_refused("wo", "correlation-key.control-char"),
        ),
        push(
            "data a recursion bomb",
            "wo",
            nested(10_000).as_bytes(),
            "m-bomb",
            Outcome("parked"),
            Row::Parked("payload is not a work-order-completed event"),
            ingested("wo", "parked"),
        ),
        push(
            "data of 600 KiB",
            "wo",
            &work_order(&"k".repeat(600 << 10), 1),
            "m-600k",
            Outcome("parked"),
            Row::Parked("correlation-key.max-bytes"),
            rule_refused("wo", "correlation-key.max-bytes"),
        ),
        Case {
            name: "data URL-safe base64",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-url", "data": "{}"}}"#,
                base64::engine::general_purpose::URL_SAFE.encode(base64_sensitive())
            ))),
            sent: base64_sensitive(),
            answer: Outcome("inserted"),
            row: Row::Open("b64~~~?>?>"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "data standard base64 without padding",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-nopad", "data": "{}"}}"#,
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(work_order("nopad", 12))
            ))),
            sent: work_order("nopad", 12),
            answer: Outcome("inserted"),
            row: Row::Open("nopad"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "data URL-safe base64 without padding",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-url-nopad", "data": "{}"}}"#,
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(base64_sensitive())
            ))),
            sent: base64_sensitive(),
            answer: Outcome("inserted"),
            row: Row::Open("b64~~~?>?>"),
            counted: ingested("wo", "inserted"),
        },
        // --- odd but legal envelopes: stored, nothing lost -------------------------------
        Case {
            name: "unknown fields and an ordering key",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-extra", "orderingKey": "k", "whatever": [1, {{"a": null}}], "data": "{}"}}"#,
                b64(&work_order("extra", 1))
            ))),
            sent: work_order("extra", 1),
            answer: Outcome("inserted"),
            row: Row::Open("extra"),
            counted: ingested("wo", "inserted"),
        },
        bad_envelope(
            "the message twice in one body",
            format!(
                r#"{{"message": {{"messageId": "m-first", "data": "{}"}}, "message": {{"messageId": "m-second"}}}}"#,
                b64(b"first")
            ),
            "`message` appears twice in one object",
        ),
        bad_envelope(
            "the message id twice",
            with_message(r#"{"messageId": "m-a", "messageId": "m-b"}"#),
            "`message.messageId` appears twice",
        ),
        bad_envelope(
            "an attribute twice",
            with_message(r#"{"messageId": "m", "attributes": {"eventId": "1", "eventId": "2"}}"#),
            "`message.attributes.eventId` appears twice",
        ),
        Case {
            name: "a NUL in the message id",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-\u0000-nul", "data": "{}"}}"#,
                b64(&work_order("nulid", 1))
            ))),
            sent: work_order("nulid", 1),
            answer: Outcome(""),
            row: Row::Stored,
            counted: None,
        },
        Case {
            name: "a NUL in the publish time",
            req: Req::new("POST", "/push/wo").json(with_message(&format!(
                r#"{{"messageId": "m-nultime", "publishTime": "2026\u0000", "data": "{}"}}"#,
                b64(&work_order("nultime", 1))
            ))),
            sent: work_order("nultime", 1),
            answer: Outcome(""),
            row: Row::Stored,
            counted: None,
        },
        Case {
            name: "NUL in an attribute key and value",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("nulattr", 1), json!({"a\u{0}b": "c\u{0}d"}), "m-nulattr").to_string()),
            sent: work_order("nulattr", 1),
            answer: Outcome("inserted"),
            row: Row::Open("nulattr"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "a 512 KiB attribute value",
            req: Req::new("POST", "/push/wo").json(
                envelope(&work_order("bigattr", 1), json!({"big": "v".repeat(512 << 10)}), "m-bigattr").to_string(),
            ),
            sent: work_order("bigattr", 1),
            answer: Outcome("inserted"),
            row: Row::Open("bigattr"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "a 64 KiB attribute key",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("bigkey", 1), json!({"k".repeat(64 << 10): "v"}), "m-bigkey").to_string()),
            sent: work_order("bigkey", 1),
            answer: Outcome("inserted"),
            row: Row::Open("bigkey"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "10,000 attributes",
            req: Req::new("POST", "/push/wo").json(
                envelope(
                    &work_order("manyattrs", 1),
                    Value::Object((0..10_000).map(|i| (format!("a{i}"), json!("v"))).collect()),
                    "m-manyattrs",
                )
                .to_string(),
            ),
            sent: work_order("manyattrs", 1),
            answer: Outcome("inserted"),
            row: Row::Open("manyattrs"),
            counted: ingested("wo", "inserted"),
        },
        Case {
            name: "a 64 KiB message id",
            req: Req::new("POST", "/push/wo")
                .json(envelope(&work_order("longid", 1), json!({}), &"i".repeat(64 << 10)).to_string()),
            sent: work_order("longid", 1),
            answer: Outcome("inserted"),
            row: Row::Open("longid"),
            counted: ingested("wo", "inserted"),
        },
        push(
            "a message id of control characters and emoji",
            "wo",
            &work_order("oddid", 1),
            "m-\u{1}\u{7f}\u{2028}😀",
            Outcome("inserted"),
            Row::Open("oddid"),
            ingested("wo", "inserted"),
        ),
        // --- plugins that choke ---------------------------------------------------------
        push(
            "plugin panics",
            "hostile",
            b"panic",
            "h-panic",
            Outcome("parked"),
            Row::Parked("plugin fault during decode"),
            ingested("hostile", "parked"),
        ),
        push(
            "plugin loops",
            "hostile",
            b"loop",
            "h-loop",
            Outcome("parked"),
            Row::Parked("plugin fault during decode"),
            ingested("hostile", "parked"),
        ),
        push(
            "plugin allocates 1 GiB",
            "hostile",
            b"alloc",
            "h-alloc",
            Outcome("parked"),
            Row::Parked("plugin fault during decode"),
            ingested("hostile", "parked"),
        ),
        push(
            "plugin answers 9 MiB",
            "hostile",
            b"big9",
            "h-big9",
            Outcome("parked"),
            Row::Parked("plugin returned 9437184 bytes, more than the 1048576 allowed"),
            ingested("hostile", "parked"),
        ),
        push(
            "plugin writes to stderr and panics",
            "hostile",
            b"chatty-panic:corpus-7",
            "h-chatty",
            Outcome("parked"),
            Row::Parked("corpus-7"),
            ingested("hostile", "parked"),
        ),
        Case {
            name: "plugin sleeps (first try: not acked)",
            req: Req::new("POST", "/push/hostile").json(envelope(b"sleep", json!({}), "h-sleep").to_string()),
            sent: Vec::new(),
            answer: Refused(503, Some("plugin_busy"), "will be redelivered"),
            row: Row::None,
            counted: rejected("hostile", "plugin_busy"),
        },
        push(
            "plugin sleeps (second try: parked)",
            "hostile",
            b"sleep",
            "h-sleep",
            Outcome("parked"),
            Row::Parked("2 times"),
            ingested("hostile", "parked"),
        ),
        push(
            "plugin key with a colon",
            "hostile",
            b"fine:1",
            "h-fine",
            Outcome("inserted"),
            Row::Open("fine"),
            ingested("hostile", "inserted"),
        ),
        push(
            "plugin key of 64 KiB",
            "unruly",
            br#"{"key_bytes": 65536}"#,
            "u-key",
            Outcome("parked"),
            Row::Parked("correlation-key.max-bytes"),
            rule_refused("unruly", "correlation-key.max-bytes"),
        ),
        push(
            "plugin dedup key of 64 KiB",
            "unruly",
            br#"{"dedup": "d", "dedup_bytes": 65536}"#,
            "u-dedup",
            Outcome("parked"),
            Row::Parked("dedup-key.max-bytes"),
            rule_refused("unruly", "dedup-key.max-bytes"),
        ),
        push(
            "plugin key with a line break",
            "unruly",
            br#"{"key": "a\nb"}"#,
            "u-lf",
            Outcome("parked"),
            Row::Parked("correlation-key.control-char"),
            rule_refused("unruly", "correlation-key.control-char"),
        ),
        push(
            "plugin empty key",
            "unruly",
            br#"{"key": ""}"#,
            "u-empty",
            Outcome("parked"),
            Row::Parked("correlation-key.empty"),
            rule_refused("unruly", "correlation-key.empty"),
        ),
        push(
            "plugin event type of 4 KiB",
            "unruly",
            format!(r#"{{"event_type": "{}"}}"#, "t".repeat(4096)).as_bytes(),
            "u-type",
            Outcome("parked"),
            Row::Parked("event-type.max-bytes"),
            rule_refused("unruly", "event-type.max-bytes"),
        ),
        push(
            "plugin decode error",
            "unruly",
            b"[1, 2, 3]",
            "u-bad",
            Outcome("parked"),
            Row::Parked("not unruly orders"),
            ingested("unruly", "parked"),
        ),
        push(
            "plugin ignores",
            "unruly",
            br#"{"ignore": "not for us"}"#,
            "u-ignore",
            Outcome("ignored"),
            Row::Ignored("ignored by the plugin: not for us"),
            ingested("unruly", "ignored"),
        ),
        push(
            "plugin ignores with a NUL in the reason",
            "unruly",
            br#"{"ignore": "not\u0000ours"}"#,
            "u-ignore-nul",
            Outcome("ignored"),
            Row::Ignored("ignored by the plugin: not\\u{0}ours"),
            ingested("unruly", "ignored"),
        ),
        push(
            "plugin ignores with a 100 KiB reason",
            "unruly",
            br#"{"ignore": "long", "ignore_bytes": 102400}"#,
            "u-ignore-long",
            Outcome("ignored"),
            Row::Ignored("ignored by the plugin: long"),
            ingested("unruly", "ignored"),
        ),
        push(
            "plugin good event",
            "unruly",
            br#"{"key": "u-1"}"#,
            "u-good",
            Outcome("inserted"),
            Row::Open("u-1"),
            ingested("unruly", "inserted"),
        ),
    ];
    // --- the admin API with hostile values: refused, nothing changes ---------------------
    let get = |path: &str| Req::new("GET", path.to_string());
    let post = |path: &str, body: &str| Req::new("POST", path.to_string()).json(body.to_string());
    let admin: Vec<(&'static str, Req, Answer)> = vec![
        (
            "list: NUL in key",
            get("/api/entries?key=%00"),
            Refused(400, None, "query parameter `key` holds a NUL character"),
        ),
        (
            "list: NUL in route",
            get("/api/entries?route=w%00o"),
            Refused(400, None, "query parameter `route` holds a NUL character"),
        ),
        ("list: NUL in status", get("/api/entries?status=%00"), Refused(400, None, "")),
        (
            "list: NUL in text",
            get("/api/entries?text=a%00"),
            Refused(400, None, "query parameter `text` holds a NUL character"),
        ),
        (
            "list: NUL in fingerprint",
            get("/api/entries?fingerprint=%00"),
            Refused(400, None, "query parameter `fingerprint` holds a NUL character"),
        ),
        ("list: SQL wildcards in text", get("/api/entries?text=%25_%5C"), Json(200)),
        ("list: negative limit", get("/api/entries?limit=-1"), Refused(400, None, "limit")),
        ("list: limit past u32", get("/api/entries?limit=99999999999"), Refused(400, None, "limit")),
        ("list: after past i64", get("/api/entries?after=99999999999999999999"), Refused(400, None, "after")),
        ("list: after not a number", get("/api/entries?after=1e3"), Refused(400, None, "after")),
        ("list: unknown filter", get("/api/entries?bogus=1"), Refused(400, None, "bogus")),
        ("list: unknown status", get("/api/entries?status=parked%20or%201=1"), Refused(400, None, "unknown status")),
        ("list: limit 0 is one", get("/api/entries?limit=0"), Json(200)),
        ("list: negative after", get("/api/entries?after=-9223372036854775808&limit=1"), Json(200)),
        ("list: an 8 KiB route", get(&format!("/api/entries?route={}", "r".repeat(8192))), Json(200)),
        ("list: key not UTF-8", get("/api/entries?key=%FF%FE"), Json(200)),
        ("list: SQL in the key", get("/api/entries?key=%27%3B%20DROP%20TABLE%20inbox_entry%3B--"), Json(200)),
        ("show: negative id", get("/api/entries/-1"), Refused(404, None, "no entry -1")),
        ("show: id past i64", get("/api/entries/99999999999999999999"), Refused(400, None, "")),
        ("show: NUL id", get("/api/entries/%00"), Refused(400, None, "")),
        (
            "failures: NUL route",
            get("/api/failures?route=%00"),
            Refused(400, None, "query parameter `route` holds a NUL character"),
        ),
        ("failures: limit not a number", get("/api/failures?limit=many"), Refused(400, None, "limit")),
        ("audit: after not a number", get("/api/audit?after=x"), Refused(400, None, "after")),
        ("repairs list: negative limit", get("/api/repairs?limit=-1"), Refused(400, None, "limit")),
        ("repairs list: unknown field", get("/api/repairs?bogus=1"), Refused(400, None, "bogus")),
        (
            "repair: not JSON",
            Req::new("POST", "/api/repairs").header("content-type", b"text/plain").header("x", b"1"),
            Refused(415, None, "Content-Type"),
        ),
        (
            "repair: NUL in text",
            post("/api/repairs", r#"{"action": "requeue", "text": "a\u0000", "dry_run": true}"#),
            Refused(400, None, "`text` holds a NUL character"),
        ),
        (
            "repair: NUL in key",
            post("/api/repairs", r#"{"action": "requeue", "key": "\u0000", "dry_run": true}"#),
            Refused(400, None, "`key` holds a NUL character"),
        ),
        (
            "repair: NUL in fingerprint",
            post("/api/repairs", r#"{"action": "requeue", "fingerprint": "\u0000"}"#),
            Refused(400, None, "`fingerprint` holds a NUL character"),
        ),
        ("repair: unknown action", post("/api/repairs", r#"{"action": "explode"}"#), Refused(422, None, "explode")),
        (
            "repair: rate 0",
            post("/api/repairs", r#"{"action": "requeue", "rate": 0}"#),
            Refused(400, None, "rate must be between"),
        ),
        (
            "repair: rate past u32",
            post("/api/repairs", r#"{"action": "requeue", "rate": 99999999999}"#),
            Refused(422, None, ""),
        ),
        (
            "repair: huge time",
            post("/api/repairs", r#"{"action": "requeue", "received_after": 1e300}"#),
            Refused(422, None, ""),
        ),
        (
            "repair: park without reason",
            post("/api/repairs", r#"{"action": "park", "dry_run": true}"#),
            Refused(400, None, "needs a `reason`"),
        ),
        (
            "repair: a recursion bomb",
            post("/api/repairs", &format!(r#"{{"action": "requeue", "x": {}}}"#, nested(10_000))),
            Refused(400, None, "recursion limit"),
        ),
        (
            "park: NUL in the reason",
            post("/api/entries/@no data at all@/park", r#"{"reason": "a\u0000b"}"#),
            Refused(400, None, "`reason` holds a NUL character"),
        ),
        (
            "ignore: NUL in the reason",
            post("/api/entries/@no data at all@/ignore", r#"{"reason": "\u0000"}"#),
            Refused(400, None, "`reason` holds a NUL character"),
        ),
        (
            "ignore: reason a number",
            post("/api/entries/@no data at all@/ignore", r#"{"reason": 5}"#),
            Refused(422, None, "reason"),
        ),
        (
            "ignore: unknown field",
            post("/api/entries/@no data at all@/ignore", r#"{"reason": "x", "force": true}"#),
            Refused(422, None, "force"),
        ),
        (
            "pause: NUL in the reason",
            post("/api/routes/wo/pause", r#"{"reason": "a\u0000b"}"#),
            Refused(400, None, "`reason` holds a NUL character"),
        ),
        (
            "pause: NUL in the route",
            post("/api/routes/w%00o/pause", r#"{"reason": "x"}"#),
            Refused(404, None, "no route named"),
        ),
        (
            "resume: a route never paused",
            Req::new("POST", "/api/routes/wo/resume"),
            Refused(409, None, "is not paused"),
        ),
        ("purge: a negative age", post("/api/purge", r#"{"older_than": "-1d"}"#), Refused(400, None, "older_than")),
        (
            "purge: NUL in the age",
            post("/api/purge", r#"{"older_than": "1d\u0000"}"#),
            Refused(400, None, "`older_than` holds a NUL character"),
        ),
        ("purge: an age past any clock", post("/api/purge", r#"{"older_than": "99999999999d"}"#), Json(200)),
    ];
    for (name, req, answer) in admin {
        let row = match name {
            n if n.starts_with("park:") || n.starts_with("ignore:") => Row::Keeps("no data at all", Status::Parked),
            _ => Row::None,
        };
        cases.push(Case { name, req, sent: Vec::new(), answer, row, counted: None });
    }
    cases
}

// ---------------------------------------------------------------------------------------
// Running the table
// ---------------------------------------------------------------------------------------

/// The answer as received: status, `Access-Control-*` headers, body as JSON (`None`
/// when it is not JSON).
struct Got {
    status: u16,
    cors: Vec<String>,
    text: String,
    json: Option<Value>,
}

/// Sends the head alone, declaring a body that never comes, and reads the answer
/// until the server closes the connection.
async fn send_head(inlet: &Inlet, req: &Req, declared: usize) -> Got {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = inlet.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n", req.method, req.path)
        .into_bytes();
    for (name, value) in &req.headers {
        head.extend_from_slice(format!("{name}: ").as_bytes());
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    stream.write_all(&head).await.expect("send the head");
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut received))
        .await
        .expect("the server answers and closes within a minute")
        .expect("read the answer");
    let text = String::from_utf8_lossy(&received).into_owned();
    let status = text.strip_prefix("HTTP/1.1 ").and_then(|r| r.get(..3)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let lower = text.to_ascii_lowercase();
    let cors = lower.lines().filter(|l| l.starts_with("access-control-")).map(str::to_string).collect();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    let json = serde_json::from_str(&body).ok();
    Got { status, cors, text: body, json }
}

async fn send(inlet: &Inlet, name: &str, req: &Req, ids: &HashMap<&str, i64>) -> Got {
    let mut path = req.path.clone();
    for (name, id) in ids {
        path = path.replace(&format!("@{name}@"), &id.to_string());
    }
    assert!(!path.contains('@'), "a case refers to an entry no earlier case made: {path}");
    if let Some(declared) = req.declared {
        return send_head(inlet, req, declared).await;
    }
    let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap();
    let mut r = inlet.http.request(method, format!("{}{path}", inlet.base)).body(req.body.clone());
    for (name, value) in &req.headers {
        r = r.header(name.as_str(), reqwest::header::HeaderValue::from_bytes(value).unwrap());
    }
    let response = match r.send().await {
        Ok(response) => response,
        // Only a case that allows it may end so (see `Answer::Cut`).
        Err(e) => return Got { status: 0, cors: Vec::new(), text: format!("`{name}`: no answer: {e}"), json: None },
    };
    let status = response.status().as_u16();
    let cors = response
        .headers()
        .keys()
        .filter(|k| k.as_str().starts_with("access-control-"))
        .map(|k| k.to_string())
        .collect();
    let text = response.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).ok();
    Got { status, cors, text, json }
}

/// Checks the answer; the problems found.
fn check_answer(want: &Answer, got: &Got) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    if !got.cors.is_empty() {
        expect(false, format!("answered with CORS headers {:?}", got.cors));
    }
    let shown = got.text.chars().take(300).collect::<String>();
    match want {
        Answer::Bare(status) => {
            expect(got.status == *status, format!("status {} (want {status}): {shown}", got.status))
        }
        Answer::Cut(status) => expect(
            got.status == *status || got.status == 0,
            format!("status {} (want {status} or a cut): {shown}", got.status),
        ),
        Answer::Json(status) => {
            expect(got.status == *status, format!("status {} (want {status}): {shown}", got.status));
            expect(got.json.is_some(), format!("not JSON: {shown}"));
        }
        Answer::Outcome(outcome) => {
            expect(got.status == 200, format!("status {} (want 200): {shown}", got.status));
            let body = got.json.clone().unwrap_or_default();
            expect(body["entry"].is_i64(), format!("no entry in {shown}"));
            if !outcome.is_empty() {
                expect(body["outcome"] == *outcome, format!("outcome {} (want {outcome})", body["outcome"]));
            }
        }
        Answer::Refused(status, reason, says) => {
            expect(got.status == *status, format!("status {} (want {status}): {shown}", got.status));
            let Some(body) = &got.json else {
                expect(false, format!("the refusal is not JSON: {shown}"));
                return problems;
            };
            let error = body["error"].as_str().unwrap_or_default();
            expect(!error.is_empty(), format!("no `error` in {body}"));
            expect(error.contains(says), format!("`error` does not say `{says}`: {error}"));
            if let Some(reason) = reason {
                expect(body["reason"] == *reason, format!("reason {} (want {reason})", body["reason"]));
            } else {
                expect(body.get("reason").is_none(), format!("an admin refusal with a push reason: {body}"));
            }
        }
    }
    problems
}

/// Checks the rows the case left; the problems found, and the entry the case made or named.
async fn check_rows(
    inlet: &Inlet,
    case: &Case,
    got: &Got,
    new: &[Entry],
    ids: &HashMap<&str, i64>,
) -> (Vec<String>, Option<i64>) {
    let mut problems = Vec::new();
    let answered = got.json.as_ref().and_then(|b| b["entry"].as_i64());
    let one = |problems: &mut Vec<String>| -> Option<Entry> {
        if new.len() != 1 {
            problems.push(format!(
                "{} new rows (want 1): {:?}",
                new.len(),
                new.iter().map(|e| (e.id, e.status)).collect::<Vec<_>>()
            ));
            return None;
        }
        let e = new[0].clone();
        if answered != Some(e.id) {
            problems.push(format!("the answer names entry {answered:?}, the new row is {}", e.id));
        }
        if e.raw_data != case.sent {
            problems.push(format!("the row holds {} bytes of data, {} were sent", e.raw_data.len(), case.sent.len()));
        }
        Some(e)
    };
    let error_of = |e: &Entry| e.last_error.clone().unwrap_or_default();
    match &case.row {
        Row::None => {
            if !new.is_empty() {
                problems.push(format!("refused, yet {} new rows", new.len()));
            }
        }
        Row::Open(key) => {
            if let Some(e) = one(&mut problems) {
                if !matches!(e.status, Status::Open | Status::InProgress | Status::Done) {
                    problems.push(format!("status {:?} (want one to deliver): {}", e.status, error_of(&e)));
                }
                if e.correlation_key.as_deref() != Some(key) {
                    problems.push(format!(
                        "key {:?} (want {key})",
                        e.correlation_key.as_deref().map(|k| k.chars().take(40).collect::<String>())
                    ));
                }
            }
        }
        Row::Parked(says) | Row::Ignored(says) => {
            let want = if matches!(case.row, Row::Parked(_)) { Status::Parked } else { Status::Ignored };
            if let Some(e) = one(&mut problems) {
                if e.status != want {
                    problems.push(format!("status {:?} (want {want:?})", e.status));
                }
                if !error_of(&e).contains(says) {
                    problems.push(format!(
                        "the reason does not say `{says}`: {}",
                        error_of(&e).chars().take(300).collect::<String>()
                    ));
                }
                // Cut at `max_reason_bytes` (4096), plus the marker that gives the full size.
                if e.last_error
                    .as_ref()
                    .is_some_and(|r| r.len() > 4096 && !(r.len() < 4096 + 64 && r.contains("[cut: ")))
                {
                    problems.push(format!("a reason of {} bytes is stored (the cap is 4096)", error_of(&e).len()));
                }
            }
        }
        Row::Conflict(of) => {
            if let Some(e) = one(&mut problems)
                && (e.status != Status::Parked || e.conflict_of != ids.get(of).copied())
            {
                problems.push(format!(
                    "status {:?}, conflict_of {:?} (want PARKED, {:?})",
                    e.status,
                    e.conflict_of,
                    ids.get(of)
                ));
            }
        }
        Row::Duplicate(of) => {
            if !new.is_empty() {
                problems.push(format!("a duplicate made {} new rows", new.len()));
            }
            if answered != ids.get(of).copied() {
                problems.push(format!("the answer names {answered:?}, not the entry of `{of}` ({:?})", ids.get(of)));
            }
        }
        Row::Stored => {
            if let Some(e) = one(&mut problems)
                && e.status == Status::Parked
                && error_of(&e).is_empty()
            {
                problems.push("parked without a reason".into());
            }
        }
        Row::Keeps(of, status) => {
            if !new.is_empty() {
                problems.push(format!("{} new rows", new.len()));
            }
            let id = ids[of];
            let now = inlet.store.get(id).await.unwrap().map(|e| e.status);
            if now != Some(*status) {
                problems.push(format!("entry {id} of `{of}` is {now:?} (want {status:?})"));
            }
        }
    }
    let made = match &case.row {
        Row::Keeps(..) | Row::None => None,
        Row::Duplicate(_) => answered,
        _ => new.first().map(|e| e.id),
    };
    (problems, made)
}

async fn run_corpus(backend: Backend) {
    let inlet = Inlet::start(backend).await;
    let cases = corpus();
    assert!(cases.len() >= 80, "the corpus has {} cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "two cases named `{}`", c.name);
    }
    let mut ids: HashMap<&str, i64> = HashMap::new();
    let mut accepted: Vec<(&str, i64)> = Vec::new();
    let mut failures = Vec::new();
    let mut last_id = 0;
    let mut rows = 0;
    for case in &cases {
        let before = match &case.counted {
            Some(sample) => inlet.counter(sample).await,
            None => 0,
        };
        let got = send(&inlet, case.name, &case.req, &ids).await;
        let mut problems = check_answer(&case.answer, &got);
        let new = inlet.rows_after(last_id).await;
        rows += new.len();
        last_id = new.iter().map(|e| e.id).max().unwrap_or(last_id);
        let (row_problems, made) = check_rows(&inlet, case, &got, &new, &ids).await;
        problems.extend(row_problems);
        if let Some(sample) = &case.counted {
            let after = inlet.counter(sample).await;
            if after != before + 1 {
                problems.push(format!("{sample} went from {before} to {after} (want +1)"));
            }
        }
        // Nothing lost: a 2xx is an ack and must have a row; anything else is a nack.
        if (200..300).contains(&got.status) && case.req.path.starts_with("/push/") {
            match got.json.as_ref().and_then(|b| b["entry"].as_i64()) {
                Some(id) => accepted.push((case.name, id)),
                None => problems.push("acked without naming an entry".into()),
            }
        }
        if let Some(id) = made {
            ids.insert(case.name, id);
        }
        if !problems.is_empty() {
            failures.push(format!("{backend:?} `{}`:\n    {}", case.name, problems.join("\n    ")));
        }
    }
    for (name, id) in &accepted {
        if inlet.store.get(*id).await.unwrap().is_none() {
            failures.push(format!("{backend:?} `{name}`: acked entry {id} is not in the inbox"));
        }
    }
    let stored = inlet.rows_after(0).await.len();
    if stored != rows {
        failures.push(format!("{backend:?}: the inbox holds {stored} rows, the cases made {rows}"));
    }
    eprintln!("{backend:?}: {} cases, {} acked pushes, {stored} rows", cases.len(), accepted.len());
    if let Some(running) = inlet.running {
        running.stop().await;
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_corpus_on_sqlite() {
    run_corpus(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_corpus_on_postgres() {
    run_corpus(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------------------
// Broken routing files and team files
// ---------------------------------------------------------------------------------------

fn platform_file(dir: &std::path::Path) {
    std::fs::write(dir.join("00-platform.toml"), "[store]\nurl = \"sqlite://inbox.db\"\n").unwrap();
}

fn team_route(name: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        plugin_path("work_order").display()
    )
}

/// A directory with the platform file, a good team file and `broken.toml` holding
/// `bytes`: the good route loads; the broken file refuses only what it declares, with
/// an error naming it (and the line when there is one).
fn load_with_broken_team_file(bytes: &[u8]) -> Config {
    let dir = tempfile::tempdir().unwrap();
    platform_file(dir.path());
    std::fs::write(dir.path().join("good.toml"), team_route("good")).unwrap();
    std::fs::write(dir.path().join("broken.toml"), bytes).unwrap();
    let config = Config::load_partial(dir.path()).unwrap_or_else(|e| panic!("a team's file stopped every team:\n{e}"));
    assert_eq!(
        config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["good"],
        "the good team's route runs"
    );
    std::mem::forget(dir); // the paths in `config` stay valid for the caller's messages
    config
}

#[test]
fn a_team_file_that_is_not_utf8_refuses_only_its_own_routes() {
    let mut bytes = team_route("billing").into_bytes();
    bytes.extend_from_slice(b"# caf\xe9 in Latin-1\n");
    let config = load_with_broken_team_file(&bytes);
    let refused: Vec<_> = config.refused.iter().map(|r| r.name.as_ref().map(|n| n.to_string())).collect();
    assert_eq!(refused, [Some("billing".to_string())], "the route it declares is refused by name");
    let error = config.refused[0].errors.to_string();
    assert!(error.contains("broken.toml:6:6") && error.contains("not UTF-8"), "{error}");
}

#[test]
fn broken_team_files_refuse_themselves_with_an_error_naming_the_file() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("binary", vec![0, 159, 146, 150, 255, 0, 1, 2], "broken.toml:1:2"),
        ("a NUL in a string", team_route("nul").replace("push", "pu\0sh").into_bytes(), "broken.toml:4:22"),
        ("half a route", b"[[route]]\nname = \"half\"\nplugin = ".to_vec(), "broken.toml:3"),
        ("a recursion bomb", format!("x = {}", "[".repeat(100_000)).into_bytes(), "broken.toml:1"),
        ("a route in a table of the wrong type", b"route = 5\n".to_vec(), "broken.toml:1"),
    ];
    for (what, bytes, says) in cases {
        let config = load_with_broken_team_file(&bytes);
        assert_eq!(config.refused.len(), 1, "{what}: {:?}", config.refused);
        let error = config.refused[0].errors.to_string();
        assert!(error.contains(says), "{what}: the error does not say `{says}`:\n{error}");
    }
}

#[test]
fn empty_and_bom_team_files_are_files_without_routes_or_with_them() {
    // An empty team file declares nothing: nothing is refused.
    let config = load_with_broken_team_file(b"");
    assert!(config.refused.is_empty(), "{:?}", config.refused);
    let config = load_with_broken_team_file(b"\n# only a comment\n\n");
    assert!(config.refused.is_empty(), "{:?}", config.refused);
    // A UTF-8 BOM, as some editors write: the file reads as if it were not there.
    let dir = tempfile::tempdir().unwrap();
    platform_file(dir.path());
    std::fs::write(dir.path().join("bom.toml"), [b"\xef\xbb\xbf".as_slice(), team_route("bom").as_bytes()].concat())
        .unwrap();
    let config = Config::load_partial(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!((names, config.refused.len()), (vec!["bom"], 0), "{:?}", config.refused);
}

#[test]
fn a_broken_shared_file_stops_the_load_naming_file_and_line() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not UTF-8", b"[store]\nurl = \"sqlite://inbox.db\"\n# \xff\n".to_vec(), "inlet.toml:3:3"),
        ("binary (the first two bytes are one character)", vec![0xde, 0xad, 0xbe, 0xef], "inlet.toml:1:2"),
        ("a bad store value", b"[store]\nurl = 5\n".to_vec(), "inlet.toml:2"),
        ("an empty key", b"[store]\nurl = \"sqlite://x.db\"\n\"\" = 1\n".to_vec(), "inlet.toml:3"),
    ];
    for (what, bytes, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inlet.toml");
        std::fs::write(&path, bytes).unwrap();
        let error = Config::load(&path).expect_err(what).to_string();
        assert!(error.contains(says), "{what}: the error does not say `{says}`:\n{error}");
    }
    // In a directory, the file with the shared settings stops everything too.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("00-platform.toml"), b"[store]\nurl = \"sqlite://inbox.db\"\n# \xff\n").unwrap();
    std::fs::write(dir.path().join("good.toml"), team_route("good")).unwrap();
    let error = Config::load_partial(dir.path()).expect_err("a shared file that is not UTF-8").to_string();
    assert!(error.contains("00-platform.toml:3:3") && error.contains("not UTF-8"), "{error}");
}

#[test]
fn the_cli_reads_names_and_the_store_beside_a_team_file_that_is_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    platform_file(dir.path());
    std::fs::write(dir.path().join("good.toml"), team_route("good")).unwrap();
    let mut bytes = team_route("billing").into_bytes();
    bytes.extend_from_slice(b"# \xff\n");
    std::fs::write(dir.path().join("billing.toml"), bytes).unwrap();
    let store = inlet::config::load_store(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(store.url.starts_with("sqlite://"), "{store:?}");
    let names = inlet::config::route_names(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names, ["billing", "good"]);
}

/// While running: a team's file rewritten in Latin-1 is refused at the next reload,
/// and only that team's route is affected — it keeps its last good version; the other
/// team's route and the reload itself go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_file_turned_latin1_while_running_refuses_only_that_team_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("00-platform.toml"),
        "[store]\nurl = \"sqlite://inbox.db\"\n\n[admin]\nauth = \"none-loopback\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("orders.toml"), team_route("orders")).unwrap();
    let billing = dir.path().join("billing.toml");
    std::fs::write(&billing, team_route("billing")).unwrap();
    let config = Config::load_partial(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let options = app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        reload_every: None,
        ..app::Options::default()
    };
    let running = app::start(&config, options).await.expect("inlet starts");
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let push = |route: &'static str, id: &'static str| {
        let body = envelope(&work_order("k", 1), json!({}), id).to_string();
        let req = http.post(format!("{base}/push/{route}")).header("content-type", "application/json").body(body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!((push("orders", "o-1").await, push("billing", "b-1").await), (200, 200));

    let mut latin1 = team_route("billing").into_bytes();
    latin1.extend_from_slice(b"# factur\xe9 par l'\xe9quipe\n");
    std::fs::write(&billing, latin1).unwrap();
    let report: Value =
        serde_json::from_str(&http.post(format!("{base}/api/reload")).send().await.unwrap().text().await.unwrap())
            .unwrap();
    assert_ne!(report["routing_file"]["result"], "refused", "one team's file does not refuse the reload: {report}");
    let refused = report["refused"].as_array().expect("refused routes");
    assert_eq!(refused.len(), 1, "{report}");
    assert_eq!(refused[0]["route"], "billing", "{report}");
    assert_eq!(refused[0]["running"], true, "it keeps its last good version: {report}");
    let error = refused[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("billing.toml:6:") && error.contains("not UTF-8"), "{report}");

    assert_eq!(push("orders", "o-2").await, 200, "the other team is untouched");
    assert_eq!(push("billing", "b-2").await, 200, "billing runs on its last good version");
    let (status, ready): (u16, Value) = {
        let r = http.get(format!("{base}/readyz")).send().await.unwrap();
        (r.status().as_u16(), serde_json::from_str(&r.text().await.unwrap()).unwrap())
    };
    assert_eq!((status, ready["status"].as_str()), (200, Some("ready")), "the other routes run: {ready}");
    running.stop().await;
}
