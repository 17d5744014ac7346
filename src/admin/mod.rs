//! The admin HTTP API: inspect and repair the inbox, metrics, health.
//!
//! - `GET  /api/entries?route=&status=&key=&after=&limit=`
//! - `GET  /api/entries/{id}` — the entry with its attempt history (`attempts`)
//! - `GET  /api/failures?route=&limit=` — parked and retrying entries grouped by route
//!   and error fingerprint, largest first
//! - `POST /api/repairs`, `GET /api/repairs` — repair by filter as rate-limited jobs
//!   ([`repairs`])
//! - `POST /api/entries/{id}/requeue` — a PARKED entry becomes due now
//! - `POST /api/entries/{id}/park` — body `{"reason": "…"}`
//! - `POST /api/reload` — apply a changed routing file and plugin files now
//! - `GET  /api/routes` — each route: state (`up` or `refused`), routing file, source,
//!   plugin file and digest, error; and routing files refused whole
//! - `POST /api/purge` — body `{"older_than": "7d"}`: delete finished entries
//! - `GET  /api/audit?after=&limit=` — the audit log
//! - `GET  /metrics`, `GET /healthz` (process up), `GET /readyz` (inbox reachable)
//!
//! Readiness: `/readyz` answers 200 while the inbox answers, even with some routes
//! refused — the healthy routes run, and restarting would not fix a team's broken file.
//! Its JSON says `"status": "degraded"` and lists the refused routes with their reasons;
//! it answers 503 only when the inbox does not.
//!
//! Every `/api` route sits behind [`access::authenticate`]; each handler checks its
//! action's role and the caller's routes. An entry of a route the caller may not
//! see answers 404, exactly like a missing one, so a team cannot probe another
//! team's entries. Every repair is written to the audit log ([`audit`]).

pub mod access;
pub mod audit;
pub mod repairs;

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use self::access::{Action, Caller};
use crate::app::Shared;
use crate::inbox::{Entry, ListFilter, NewAudit, Status, StoreError};

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    pub route: Option<String>,
    pub status: Option<String>,
    pub key: Option<String>,
    pub after: Option<i64>,
    pub limit: Option<u32>,
}

/// An entry as people see it: payloads shown as text when they are text.
pub fn entry_view(e: &Entry) -> serde_json::Value {
    let mut v = serde_json::to_value(e).expect("entries serialize");
    let text_or_b64 = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => json!({ "text": s }),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
    };
    v["raw_data"] = text_or_b64(&e.raw_data);
    if let Some(body) = &e.body {
        v["body"] = text_or_b64(body);
    }
    v
}

/// [`entry_view`] for a caller: without payload rights, `raw_data` and `body` are
/// withheld.
fn entry_view_for(e: &Entry, caller: &Caller) -> serde_json::Value {
    let mut v = entry_view(e);
    if !caller.payloads {
        v["raw_data"] = json!({ "withheld": "this token may not read payloads" });
        if e.body.is_some() {
            v["body"] = json!({ "withheld": "this token may not read payloads" });
        }
    }
    v
}

fn no_entry(id: i64) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no entry {id}") }))).into_response()
}

/// The entry if it exists and the caller may see its route; otherwise the 404 a
/// missing entry gets.
async fn visible_entry(s: &Shared, caller: &Caller, id: i64) -> Result<Entry, Response> {
    match s.store.get(id).await {
        Ok(Some(e)) if caller.may_see(&e.route) => Ok(e),
        Ok(_) => Err(no_entry(id)),
        Err(e) => Err(store_error(e)),
    }
}

fn audit_entry(caller: &Caller, action: Action, e: &Entry, outcome: &str, detail: Option<String>) -> NewAudit {
    NewAudit {
        actor: caller.name.clone(),
        action: action.as_str().into(),
        route: Some(e.route.clone()),
        subject: format!("entry {}", e.id),
        outcome: outcome.into(),
        detail,
    }
}

pub(crate) fn store_error(e: StoreError) -> Response {
    let code = if e.is_transient() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
    (code, Json(json!({ "error": e.to_string() }))).into_response()
}

pub async fn list(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Response {
    let status = match q.status.as_deref().map(str::parse::<Status>).transpose() {
        Ok(s) => s,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({ "error": e }))).into_response(),
    };
    let filter = ListFilter {
        route: q.route,
        status,
        correlation_key: q.key,
        after_id: q.after,
        limit: q.limit.unwrap_or(100).min(1000),
    };
    match list_visible(&s, &caller, filter).await {
        Ok(entries) => {
            let entries: Vec<_> = entries.iter().map(|e| entry_view_for(e, &caller)).collect();
            Json(json!({ "entries": entries })).into_response()
        }
        Err(e) => store_error(e),
    }
}

/// The filter's entries among the routes the caller may see: a filter on another
/// route finds nothing; no route filter lists each allowed route and merges them.
async fn list_visible(s: &Shared, caller: &Caller, filter: ListFilter) -> Result<Vec<Entry>, StoreError> {
    let Some(allowed) = &caller.routes else { return s.store.list(&filter).await };
    if let Some(route) = &filter.route {
        return if allowed.contains(route) { s.store.list(&filter).await } else { Ok(Vec::new()) };
    }
    let mut merged = Vec::new();
    for route in allowed {
        merged.extend(s.store.list(&ListFilter { route: Some(route.clone()), ..filter.clone() }).await?);
    }
    merged.sort_by_key(|e| e.id);
    merged.truncate(filter.limit as usize);
    Ok(merged)
}

pub async fn show(State(s): State<Arc<Shared>>, Extension(caller): Extension<Caller>, Path(id): Path<i64>) -> Response {
    let entry = match visible_entry(&s, &caller, id).await {
        Ok(e) => e,
        Err(r) => return r,
    };
    match s.store.attempts(id).await {
        Ok(attempts) => {
            let mut view = entry_view_for(&entry, &caller);
            view["attempts"] = json!(attempts);
            Json(view).into_response()
        }
        Err(e) => store_error(e),
    }
}

#[derive(Debug, Deserialize)]
pub struct FailuresQuery {
    pub route: Option<String>,
    pub limit: Option<u32>,
}

/// Failure groups of the routes the caller may see.
pub async fn failures(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<FailuresQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let routes: Vec<Option<String>> = match (&caller.routes, q.route) {
        (None, route) => vec![route],
        (Some(allowed), Some(route)) => allowed.contains(&route).then_some(Some(route)).into_iter().collect(),
        (Some(allowed), None) => allowed.iter().cloned().map(Some).collect(),
    };
    let mut groups = Vec::new();
    for route in routes {
        match s.store.failure_groups(route.as_deref(), limit).await {
            Ok(g) => groups.extend(g),
            Err(e) => return store_error(e),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.parked + g.retrying));
    groups.truncate(limit as usize);
    if !caller.payloads {
        // An error text may quote the payload (a decode error, a target's answer).
        for g in &mut groups {
            g.example_error = "withheld: this token may not read payloads".into();
        }
    }
    Json(json!({ "groups": groups })).into_response()
}

pub async fn requeue(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> Response {
    let entry = match entry_for(&s, &caller, Action::Requeue, id).await {
        Ok(e) => e,
        Err(r) => return r,
    };
    let result = s.store.requeue(id, s.clock.now()).await;
    if let (Ok(true), Some(route)) = (&result, s.routes().get(&entry.route)) {
        route.stored.notify_one();
    }
    let answer = Repair { action: Action::Requeue, done: "requeued", expected_state: "PARKED/OPEN", detail: None };
    answer.finish(&s, &caller, &entry, result).await
}

#[derive(Debug, Deserialize)]
pub struct ParkBody {
    pub reason: String,
}

pub async fn park(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
    Json(b): Json<ParkBody>,
) -> Response {
    let entry = match entry_for(&s, &caller, Action::Park, id).await {
        Ok(e) => e,
        Err(r) => return r,
    };
    let result = s.store.park(id, &format!("parked by hand: {}", b.reason), s.clock.now()).await;
    let answer = Repair { action: Action::Park, done: "parked", expected_state: "OPEN", detail: Some(b.reason) };
    answer.finish(&s, &caller, &entry, result).await
}

/// The entry an action on `id` may touch: the role is checked first (403 whatever
/// the entry), then the route (404, like a missing entry).
async fn entry_for(s: &Shared, caller: &Caller, action: Action, id: i64) -> Result<Entry, Response> {
    caller.require(action).map_err(IntoResponse::into_response)?;
    visible_entry(s, caller, id).await
}

/// How a repair of one entry is answered and audited.
struct Repair {
    action: Action,
    /// The key of the success answer, `{"requeued": id}`.
    done: &'static str,
    /// The states the repair applies to, for the 409 answer.
    expected_state: &'static str,
    detail: Option<String>,
}

impl Repair {
    async fn finish(self, s: &Shared, caller: &Caller, entry: &Entry, result: Result<bool, StoreError>) -> Response {
        let id = entry.id;
        let (outcome, response) = match result {
            Ok(true) => ("ok", Json(json!({ self.done: id })).into_response()),
            Ok(false) => {
                let error = format!("entry {id} is not {}", self.expected_state);
                ("conflict", (StatusCode::CONFLICT, Json(json!({ "error": error }))).into_response())
            }
            Err(e) => ("failed", store_error(e)),
        };
        audit::record(s.store.as_ref(), audit_entry(caller, self.action, entry, outcome, self.detail), s.clock.now())
            .await;
        response
    }
}

#[derive(Debug, Deserialize)]
pub struct PurgeBody {
    /// Finished longer ago than this, e.g. `"7d"`.
    pub older_than: String,
}

/// Deletes DONE and IGNORED entries finished before `older_than` (never PARKED).
pub async fn purge(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Json(b): Json<PurgeBody>,
) -> Response {
    if let Err(r) = caller.require(Action::Purge) {
        return r.into_response();
    }
    let older_than = match humantime::parse_duration(&b.older_than) {
        Ok(d) => d,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": format!("older_than: {e}") }))).into_response();
        }
    };
    let before = s.clock.now() - older_than.as_millis() as i64;
    let mut total = 0;
    let result = loop {
        match s.store.purge_finished(before, 10_000).await {
            Ok(0) => break Ok(total),
            Ok(n) => total += n,
            Err(e) => break Err(e),
        }
    };
    let audit = NewAudit {
        actor: caller.name.clone(),
        action: Action::Purge.as_str().into(),
        route: None,
        subject: format!("DONE and IGNORED entries finished more than {} ago", b.older_than),
        outcome: if result.is_ok() { "ok" } else { "failed" }.into(),
        detail: Some(format!("{total} deleted")),
    };
    audit::record(s.store.as_ref(), audit, s.clock.now()).await;
    match result {
        Ok(n) => Json(json!({ "purged": n })).into_response(),
        Err(e) => store_error(e),
    }
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    pub after: Option<i64>,
    pub limit: Option<u32>,
}

pub async fn audit_log(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<AuditQuery>,
) -> Response {
    if let Err(r) = caller.require(Action::ReadAudit) {
        return r.into_response();
    }
    match s.store.list_audit(q.after, q.limit.unwrap_or(100).min(1000)).await {
        Ok(lines) => Json(json!({ "audit": lines })).into_response(),
        Err(e) => store_error(e),
    }
}

pub async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.render())
        .into_response()
}

pub async fn healthz() -> &'static str {
    "ok"
}

pub async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    if let Err(e) = s.store.db_now().await {
        return store_error(e);
    }
    let routes = s.routes();
    let up: Vec<&str> = routes.iter().map(|r| r.name()).collect();
    let status = if routes.problems().is_empty() { "ready" } else { "degraded" };
    Json(json!({ "status": status, "store": "up", "routes_up": up, "refused": crate::reload::problems_view(&routes) }))
        .into_response()
}

/// Every route with its state, and what is refused.
/// Each route's state, as far as the caller may see routes: a team's token lists its
/// own routes only; routing files refused whole are listed to callers of every route.
pub async fn routes(State(s): State<Arc<Shared>>, Extension(caller): Extension<Caller>) -> Response {
    let routes = s.routes();
    let mut list = Vec::new();
    for r in routes.iter().filter(|r| caller.may_see(r.name())) {
        let plugin = r.plugin();
        let change_refused = routes.problems().iter().find(|p| p.running && p.route.as_deref() == Some(r.name()));
        list.push(json!({
            "name": r.name(),
            "state": "up",
            "file": r.config.file.display().to_string(),
            "source": source_kind(&r.config.source),
            "plugin": r.config.plugin.display().to_string(),
            "plugin_sha256": plugin.digest(),
            "error": change_refused.map(|p| format!("a newer version was refused; this one keeps serving: {}", p.error)),
        }));
    }
    let mut files = Vec::new();
    for p in routes.problems().iter().filter(|p| !p.running) {
        let Some(name) = &p.route else {
            if caller.may_see_all() {
                files.push(json!({ "file": p.file.display().to_string(), "error": p.error }));
            }
            continue;
        };
        if !caller.may_see(name) {
            continue;
        }
        let config = s.config.lock().expect("config lock").clone();
        let declared = config.route(name);
        list.push(json!({
            "name": name,
            "state": "refused",
            "file": p.file.display().to_string(),
            "source": declared.map(|c| source_kind(&c.source)),
            "plugin": declared.map(|c| c.plugin.display().to_string()),
            "plugin_sha256": null,
            "error": p.error,
        }));
    }
    Json(json!({ "routes": list, "refused_files": files })).into_response()
}

fn source_kind(source: &crate::config::SourceConfig) -> &'static str {
    match source {
        crate::config::SourceConfig::Push => "push",
        crate::config::SourceConfig::Pubsub(_) => "pubsub",
    }
}

pub async fn reload(State(s): State<Arc<Shared>>, Extension(caller): Extension<Caller>) -> Response {
    if let Err(r) = caller.require(Action::Reload) {
        return r.into_response();
    }
    let report = crate::reload::reload_now(&s).await;
    let refused = report["routing_file"]["result"] == "refused"
        || report["plugins"].as_object().is_some_and(|p| p.values().any(|v| v["result"] == "refused"));
    let audit = NewAudit {
        actor: caller.name.clone(),
        action: Action::Reload.as_str().into(),
        route: None,
        subject: "routing file and plugins".into(),
        outcome: if refused { "refused" } else { "ok" }.into(),
        detail: Some(report.to_string()),
    };
    audit::record(s.store.as_ref(), audit, s.clock.now()).await;
    Json(report).into_response()
}
