//! The admin HTTP API: inspect and repair the inbox, metrics, health.
//!
//! - `GET  /api/entries?route=&status=&key=&fingerprint=&text=&after=&limit=`
//! - `GET  /api/entries/{id}` — the entry with its attempt history (`attempts`)
//! - `GET  /api/failures?route=&limit=` — parked and retrying entries grouped by route
//!   and error fingerprint, largest first
//! - `POST /api/repairs`, `GET /api/repairs` — repair by filter as rate-limited jobs
//!   ([`repairs`])
//! - `POST /api/entries/{id}/requeue` — a PARKED entry becomes due now
//! - `POST /api/entries/{id}/park` — body `{"reason": "…"}`
//! - `POST /api/entries/{id}/ignore` — body `{"reason": "…"}`: a PARKED entry is
//!   discarded (IGNORED), with a record
//! - `POST /api/reload` — apply a changed routing file and plugin files now
//! - `GET  /api/routes` — each route: state (`up` or `refused`), routing file, source,
//!   plugin file and digest, error; and routing files refused whole
//! - `POST /api/routes/{name}/pause` — body `{"reason": "…"}`: no instance claims the
//!   route's entries until `POST /api/routes/{name}/resume`; ingest goes on
//! - `GET  /api/routes/{name}/replays`, `POST /api/routes/{name}/replays` — the
//!   route's replay windows; body `{"from": "…", "to": "…", "open_for": "1h",
//!   "reason": "…"}` opens one (redeliveries of messages published in it are stored
//!   again); `GET /api/replays/{id}` — a window and the entries it made;
//!   `POST /api/replays/{id}/close`
//! - `POST /api/purge` — body `{"older_than": "7d"}`: delete finished entries
//! - `GET  /api/audit?after=&limit=` — the audit log
//! - `GET  /api/openapi.json` — the OpenAPI 3.1 description ([`openapi`])
//! - `GET  /metrics`, `GET /healthz` (process up), `GET /readyz` (inbox reachable, not draining)
//!
//! API.md documents each request and answer. Every answer is a typed body
//! ([`answer`]); every refusal is `{"error": "…"}` with a status code.
//!
//! Readiness: `/readyz` answers 200 `{"status": "ready"}` while the inbox answers, even
//! with some routes refused — the healthy routes run, and restarting would not fix a
//! team's broken file — and 503 `{"status": "unavailable"}` when it does not, or
//! `{"status": "draining"}` from a stop signal on (the listener keeps taking pushes
//! for the drain delay, see `crate::app`). Nothing more: it is open on the push listener, to strangers. Which routes are refused and
//! why is in `GET /api/routes`, the reasons for admin tokens only (a reason may quote
//! a routing file, which a team's token has no business reading in full).
//!
//! Every `/api` route sits behind [`access::authenticate`]; each handler checks its
//! action's role and the caller's routes. An entry of a route the caller may not
//! see answers 404, exactly like a missing one, so a team cannot probe another
//! team's entries. The repairs, pauses and purges are `crate::operate`'s actions, each
//! written to the audit log there.

pub mod access;
pub mod answer;
pub mod openapi;
pub mod repairs;

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use self::access::{Action, Caller};
use self::answer::{
    ApiError, AuditPage, Body, EntryPage, EntryView, GroupRef, Health, Id, Params, PauseView, Purged, Reader,
    RefusedFile, Repaired, RouteList, RoutePaused, RouteView,
};
use crate::clock::Clock;
use crate::inbox::{Entry, ListFilter, Status, Store, StoreError};
use crate::operate::{EntryRepair, Inputs, Operator, Reason, Relays, ReplayEntries, Wake};
use crate::routing::{RouteTable, Routes};
use crate::shared::Shared;
use crate::telemetry::Metrics;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub route: Option<String>,
    pub status: Option<String>,
    pub key: Option<String>,
    /// Exactly this error fingerprint (a failure group), or `entry:ID` for the group of
    /// entry ID's error ([`answer::GroupRef`]; the only form a token without payloads
    /// may give).
    pub fingerprint: Option<String>,
    /// The last error contains this text (refused to a token without payloads).
    pub text: Option<String>,
    pub after: Option<i64>,
    pub limit: Option<u32>,
}

/// An entry as people see it: payloads shown as text when they are text.
pub fn entry_view(e: &Entry) -> EntryView {
    Reader::ALL.entry(e.clone())
}

/// The entry if it exists and the caller may see its route; otherwise the 404 a
/// missing entry gets.
async fn visible_entry(s: &InboxState, caller: &Caller, id: i64) -> Result<Entry, ApiError> {
    match s.store.get(id).await? {
        Some(e) if caller.may_see(&e.route) => Ok(e),
        _ => Err(ApiError::no_entry(id)),
    }
}

/// The operator actions of `caller` in this instance (`crate::operate`).
fn operator<'a>(s: &'a InboxState, caller: &Caller) -> Operator<'a> {
    Operator::new(s.store.as_ref(), s.clock.as_ref(), Relays::Here(s.relays.as_ref()), caller.name.clone())
}

/// What the entry, audit and operator endpoints reach: the inbox and its clock, the
/// routes serving now (a caller's access is by route) and the relays an action wakes.
#[derive(Clone)]
pub struct InboxState {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub routes: Arc<RouteTable>,
    pub relays: Arc<dyn Wake>,
}

impl FromRef<Arc<Shared>> for InboxState {
    fn from_ref(shared: &Arc<Shared>) -> InboxState {
        InboxState {
            store: Arc::clone(&shared.store),
            clock: Arc::clone(&shared.clock),
            routes: Arc::clone(&shared.routes),
            relays: Arc::clone(shared) as Arc<dyn Wake>,
        }
    }
}

/// What `/readyz` reads: whether the instance drains, and whether the inbox answers.
#[derive(Clone)]
pub struct Readiness {
    store: Arc<dyn Store>,
    drain: crate::server::Drain,
}

impl FromRef<Arc<Shared>> for Readiness {
    fn from_ref(shared: &Arc<Shared>) -> Readiness {
        Readiness { store: Arc::clone(&shared.store), drain: shared.drain.clone() }
    }
}

/// What `/metrics` reads: the registry only.
#[derive(Clone)]
pub struct Exposition(Arc<Metrics>);

impl FromRef<Arc<Shared>> for Exposition {
    fn from_ref(shared: &Arc<Shared>) -> Exposition {
        Exposition(Arc::clone(&shared.metrics))
    }
}

/// A store error as the API answers it (the handlers that return `Response`).
pub(crate) fn store_error(e: StoreError) -> Response {
    ApiError::from(e).into_response()
}

/// The page size of a listing: 100 unless asked, at most 1,000.
fn page_limit(asked: Option<u32>) -> u32 {
    asked.unwrap_or(100).clamp(1, 1000)
}

pub async fn list(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Params(q): Params<ListQuery>,
) -> Result<Json<EntryPage>, ApiError> {
    let status = q.status.as_deref().map(str::parse::<Status>).transpose().map_err(ApiError::bad_request)?;
    let reader = Reader::of(&caller);
    reader.search(q.text.as_deref())?;
    let fingerprint = group_fingerprint(&s, &caller, q.fingerprint.as_deref()).await?;
    let filter = ListFilter {
        route: q.route,
        status,
        correlation_key: q.key,
        fingerprint,
        error_text: q.text,
        after_id: q.after,
        limit: page_limit(q.limit),
        newest_first: false,
    };
    let limit = filter.limit as usize;
    let entries = list_visible(&s, &caller, filter).await?;
    let next_after = (entries.len() == limit).then(|| entries.last().map(|e| e.id)).flatten();
    let entries = entries.into_iter().map(|e| reader.entry(e)).collect();
    Ok(Json(EntryPage { entries, next_after }))
}

/// The fingerprint a `fingerprint` filter means ([`Reader::group`]): as given, or
/// that of the error entry ID has now for `entry:ID` (404 when the caller may not see
/// the entry or it has no error).
pub(crate) async fn group_fingerprint(
    s: &InboxState,
    caller: &Caller,
    given: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let Some(given) = given else { return Ok(None) };
    match Reader::of(caller).group(given)? {
        GroupRef::Fingerprint(f) => Ok(Some(f)),
        GroupRef::Like(id) => {
            let entry = visible_entry(s, caller, id).await?;
            let error = entry.last_error.as_deref().ok_or_else(|| {
                ApiError::new(StatusCode::NOT_FOUND, format!("entry {id} has no error now")).entry(id)
            })?;
            Ok(Some(crate::inbox::failures::fingerprint(error)))
        }
    }
}

/// The filter's entries among the routes the caller may see: a filter on another
/// route finds nothing; no route filter lists each allowed route and merges them.
async fn list_visible(s: &InboxState, caller: &Caller, filter: ListFilter) -> Result<Vec<Entry>, StoreError> {
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

pub async fn show(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
) -> Result<Json<EntryView>, ApiError> {
    let entry = visible_entry(&s, &caller, id).await?;
    let attempts = s.store.attempts(id).await?;
    let reader = Reader::of(&caller);
    let mut view = reader.entry(entry);
    view.attempts = Some(reader.attempts(attempts));
    Ok(Json(view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailuresQuery {
    pub route: Option<String>,
    pub limit: Option<u32>,
}

/// `GET /api/failures`: the failure groups, largest first.
#[derive(Debug, serde::Serialize)]
pub struct FailureGroups {
    pub groups: Vec<crate::inbox::failures::FailureGroup>,
}

/// Failure groups of the routes the caller may see.
pub async fn failures(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Params(q): Params<FailuresQuery>,
) -> Result<Json<FailureGroups>, ApiError> {
    let limit = page_limit(q.limit);
    let routes: Vec<Option<String>> = match (&caller.routes, q.route) {
        (None, route) => vec![route],
        (Some(allowed), Some(route)) => allowed.contains(&route).then_some(Some(route)).into_iter().collect(),
        (Some(allowed), None) => allowed.iter().cloned().map(Some).collect(),
    };
    let mut groups = Vec::new();
    for route in routes {
        groups.extend(s.store.failure_groups(route.as_deref(), limit).await?);
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.parked + g.retrying));
    groups.truncate(limit as usize);
    let reader = Reader::of(&caller);
    let groups = groups.into_iter().map(|g| reader.failure_group(g)).collect();
    Ok(Json(FailureGroups { groups }))
}

pub async fn requeue(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
) -> Result<Json<Repaired>, ApiError> {
    repair(&s, &caller, id, EntryRepair::Requeue).await
}

/// The body of `park` (and `ignore`, and a pause): why, in words a colleague will
/// understand.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasonBody {
    pub reason: String,
}

impl ReasonBody {
    /// The reason, trimmed; an empty one is refused.
    fn reason(self) -> Result<Reason, ApiError> {
        Ok(Reason::new(&self.reason, Inputs::Json)?)
    }
}

pub async fn park(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
    Body(b): Body<ReasonBody>,
) -> Result<Json<Repaired>, ApiError> {
    let reason = b.reason()?;
    repair(&s, &caller, id, EntryRepair::Park(reason)).await
}

/// Discards a PARKED entry with a reason: it becomes IGNORED (retention deletes it in
/// time), and later entries of its key, which it held back under `block-key`, are
/// delivered.
pub async fn ignore(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
    Body(b): Body<ReasonBody>,
) -> Result<Json<Repaired>, ApiError> {
    let reason = b.reason()?;
    repair(&s, &caller, id, EntryRepair::Ignore(reason)).await
}

/// A repair of one entry: the role is checked first (403 whatever the entry), then
/// the route (404, like a missing entry); then the repair, audited.
async fn repair(s: &InboxState, caller: &Caller, id: i64, repair: EntryRepair) -> Result<Json<Repaired>, ApiError> {
    caller.require(Action::from(repair.action()))?;
    visible_entry(s, caller, id).await?;
    Ok(Json(operator(s, caller).repair(id, &repair).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeBody {
    /// Finished longer ago than this, e.g. `"7d"`.
    pub older_than: String,
}

/// Deletes DONE and IGNORED entries finished before `older_than` (never PARKED).
pub async fn purge(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Body(b): Body<PurgeBody>,
) -> Result<Json<Purged>, ApiError> {
    caller.require(Action::Purge)?;
    let older_than =
        humantime::parse_duration(&b.older_than).map_err(|e| ApiError::bad_request(format!("older_than: {e}")))?;
    Ok(Json(operator(&s, &caller).purge(older_than, &b.older_than).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub after: Option<i64>,
    pub limit: Option<u32>,
}

pub async fn audit_log(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Params(q): Params<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    caller.require(Action::ReadAudit)?;
    let limit = page_limit(q.limit);
    let audit = s.store.list_audit(q.after, limit).await?;
    let next_after = (audit.len() == limit as usize).then(|| audit.last().map(|a| a.id)).flatten();
    Ok(Json(AuditPage { audit, next_after }))
}

/// The exposition; a token limited to some routes (`metrics_need_token`) reads only
/// their series and the process-wide ones. `route="-"` counts push requests that
/// named no known route, which belong to no team.
pub async fn metrics(State(Exposition(metrics)): State<Exposition>, caller: Option<Extension<Caller>>) -> Response {
    let mut text = metrics.render();
    if let Some(Extension(caller)) = caller
        && !caller.may_see_all()
    {
        text = crate::telemetry::only_routes(&text, |r| r == "-" || caller.may_see(r));
    }
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

pub async fn readyz(State(s): State<Readiness>) -> Response {
    // Draining comes first: the instance is going away whether or not the inbox
    // answers, and the load balancer must stop sending it pushes.
    if s.drain.is_draining() {
        let body = Json(serde_json::json!({ "status": "draining" }));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    if let Err(error) = s.store.db_now().await {
        tracing::warn!(%error, "not ready: the inbox does not answer");
        let body = Json(serde_json::json!({ "status": "unavailable" }));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    Json(serde_json::json!({ "status": "ready" })).into_response()
}

/// Why a route is refused, as `caller` may read it: the reason for admin tokens; for
/// others only that there is one (reasons quote routing files and plugin errors).
fn refusal_shown(caller: &Caller, error: &str) -> String {
    if caller.role >= crate::config::Role::Admin {
        error.to_string()
    } else {
        "refused by the routing configuration; an admin token (or the log) shows why".to_string()
    }
}

/// Why a running route is not as its files say: a refused change of its settings, a
/// refused version of its plugin file (one that does not load, or is not the pinned
/// build), or both.
fn running_error(caller: &Caller, change: Option<&str>, plugin_file: Option<&str>) -> Option<String> {
    let mut why = Vec::new();
    if let Some(error) = change {
        why.push(format!("a newer version was refused; this one keeps serving: {}", refusal_shown(caller, error)));
    }
    if let Some(error) = plugin_file {
        why.push(format!(
            "the plugin file was refused; the version loaded before keeps serving: {}",
            refusal_shown(caller, error)
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Each route's state, as far as the caller may see routes: a team's token lists its
/// own routes only; routing files refused whole are listed to callers of every route.
pub async fn routes(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<RouteList>, ApiError> {
    let mut paused: std::collections::HashMap<String, PauseView> =
        s.store.paused_routes(None).await?.into_iter().map(|p| (p.route.clone(), p.into())).collect();
    let routes = s.routes();
    let mut list = Vec::new();
    for r in routes.iter().filter(|r| caller.may_see(r.name())) {
        let plugin = r.plugin();
        // A refused change of the route, or of its whole file (one that no longer parses).
        let change_refused = routes.problems().iter().find(|p| {
            p.running && (p.route.as_deref() == Some(r.name()) || (p.route.is_none() && p.file == r.config.file))
        });
        list.push(RouteView {
            name: r.name().to_string(),
            state: "up",
            file: r.config.file.display().to_string(),
            source: Some(r.config.source.kind()),
            plugin: Some(r.config.plugin_shown.display().to_string()),
            plugin_sha256: Some(plugin.digest().to_string()),
            plugin_pinned_sha256: r.config.plugin_sha256.clone(),
            error: running_error(&caller, change_refused.map(|p| p.error.as_str()), r.refused_file().as_deref()),
            paused: paused.remove(r.name()),
            candidate: r.config.candidate.as_ref().map(|c| c.shown.display().to_string()),
            previous: r.config.previous.as_ref().map(|c| c.shown.display().to_string()),
            select: r.config.source.select().map(ToString::to_string),
        });
    }
    let mut refused_files = Vec::new();
    for p in routes.problems().iter().filter(|p| !p.running || p.route.is_none()) {
        let Some(name) = &p.route else {
            if caller.may_see_all() {
                let error = refusal_shown(&caller, &p.error);
                refused_files.push(RefusedFile { file: p.file.display().to_string(), error });
            }
            continue;
        };
        if !caller.may_see(name) {
            continue;
        }
        let config = s.config.lock().expect("config lock").clone();
        let declared = config.route(name);
        list.push(RouteView {
            name: name.clone(),
            state: "refused",
            file: p.file.display().to_string(),
            source: declared.map(|c| c.source.kind()),
            plugin: declared.map(|c| c.plugin_shown.display().to_string()),
            plugin_sha256: None,
            plugin_pinned_sha256: declared.and_then(|c| c.plugin_sha256.clone()),
            error: Some(refusal_shown(&caller, &p.error)),
            paused: paused.remove(name),
            candidate: declared.and_then(|c| c.candidate.as_ref()).map(|c| c.shown.display().to_string()),
            previous: declared.and_then(|c| c.previous.as_ref()).map(|c| c.shown.display().to_string()),
            select: declared.and_then(|c| c.source.select()).map(ToString::to_string),
        });
    }
    Ok(Json(RouteList { routes: list, refused_files }))
}

/// `GET /api/routes/{name}/shadow`: what the route's candidate answered differently
/// from its plugin on this instance, with samples as the caller may read them.
pub async fn shadow(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
) -> Result<Json<crate::shadow::Report>, ApiError> {
    caller.require(Action::Read)?;
    visible_route(&s.routes(), &caller, &name)?;
    let report = s.routes().get(&name).and_then(|r| r.shadow_report());
    let Some(report) = report else {
        let error = format!("route `{name}` runs no candidate: name one with `candidate = …` in its routing file");
        return Err(ApiError::new(StatusCode::NOT_FOUND, error).route(name));
    };
    Ok(Json(Reader::of(&caller).shadow(report)))
}

/// `POST /api/routes/{name}/promote`: the route's candidate becomes its plugin.
pub async fn promote(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
) -> Result<Json<crate::rollout::Stepped>, ApiError> {
    rollout_step(&s, &caller, name, crate::config::edit::Step::Promote).await
}

/// `POST /api/routes/{name}/rollback`: the route's previous version serves again.
pub async fn rollback(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
) -> Result<Json<crate::rollout::Stepped>, ApiError> {
    rollout_step(&s, &caller, name, crate::config::edit::Step::Rollback).await
}

/// One rollout step (`crate::rollout`): the routing file rewritten, this instance
/// reloaded at once (the others at their next reload), the step audited.
pub(crate) async fn rollout_step(
    s: &Arc<Shared>,
    caller: &Caller,
    name: String,
    step: crate::config::edit::Step,
) -> Result<Json<crate::rollout::Stepped>, ApiError> {
    let action = match step {
        crate::config::edit::Step::Promote => Action::Promote,
        crate::config::edit::Step::Rollback => Action::Rollback,
    };
    caller.require(action)?;
    visible_route(&s.routes(), caller, &name)?;
    let declared = s.config.lock().expect("config lock").route(&name).cloned();
    let Some(route) = declared else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no route named `{name}`")).route(name));
    };
    let cache = s.routes().cache().map(std::path::Path::to_path_buf);
    let result = tokio::task::spawn_blocking(move || crate::rollout::step(&route, step, cache.as_deref()))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the step did not finish: {e}")))?;
    operator(&InboxState::from_ref(s), caller).record_rollout(step, &name, &result).await;
    match result {
        Ok(done) => {
            crate::reload::reload_now(s).await;
            Ok(Json(done))
        }
        Err(e) => {
            let status = if e.is_conflict() { StatusCode::CONFLICT } else { StatusCode::INTERNAL_SERVER_ERROR };
            Err(ApiError::new(status, e.to_string()).route(name))
        }
    }
}

/// Whether `name` is a route of the routing files (running or refused) that the
/// caller may see; otherwise the 404 an unknown route gets.
fn visible_route(routes: &Routes, caller: &Caller, name: &str) -> Result<(), ApiError> {
    let declared = routes.get(name).is_some() || routes.refusal(name).is_some();
    if declared && caller.may_see(name) {
        return Ok(());
    }
    Err(ApiError::new(StatusCode::NOT_FOUND, format!("no route named `{name}`")).route(name))
}

/// Pauses a route for every instance ([`Operator::pause`]).
pub async fn pause_route(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
    Body(b): Body<ReasonBody>,
) -> Result<Json<RoutePaused>, ApiError> {
    caller.require(Action::Pause)?;
    visible_route(&s.routes.get(), &caller, &name)?;
    let reason = b.reason()?;
    Ok(Json(operator(&s, &caller).pause(&name, reason).await?))
}

/// Resumes a paused route ([`Operator::resume`]).
pub async fn resume_route(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
) -> Result<Json<RoutePaused>, ApiError> {
    caller.require(Action::Resume)?;
    visible_route(&s.routes.get(), &caller, &name)?;
    Ok(Json(operator(&s, &caller).resume(&name).await?))
}

/// A route's replay windows, oldest first.
#[derive(Debug, serde::Serialize)]
pub struct ReplayList {
    pub windows: Vec<crate::inbox::ReplayWindow>,
}

/// The body of `POST /api/routes/{name}/replays`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// Publish times from (inclusive) and to (exclusive), RFC 3339.
    pub from: String,
    pub to: String,
    /// How long redeliveries are taken (default 1h, at most 7d).
    pub open_for: Option<String>,
    pub reason: String,
}

/// The replay windows of a route the caller may see.
pub async fn replays(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
) -> Result<Json<ReplayList>, ApiError> {
    caller.require(Action::Read)?;
    visible_route(&s.routes.get(), &caller, &name)?;
    Ok(Json(ReplayList { windows: s.store.replay_windows(Some(&name), None).await? }))
}

/// Opens a replay window on a route ([`Operator::open_replay`]).
pub async fn open_replay(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(name): Id<String>,
    Body(b): Body<ReplayBody>,
) -> Result<Json<crate::inbox::ReplayWindow>, ApiError> {
    caller.require(Action::Replay)?;
    visible_route(&s.routes.get(), &caller, &name)?;
    let time = |field: &str, value: &str| {
        crate::pubsub_client::parse_time(value)
            .map(crate::clock::millis_of)
            .map_err(|e| ApiError::bad_request(format!("`{field}`: {e}")))
    };
    let published = time("from", &b.from)?..time("to", &b.to)?;
    let open_for = match b.open_for.as_deref() {
        None => std::time::Duration::from_secs(3600),
        Some(d) => humantime::parse_duration(d)
            .map_err(|e| ApiError::bad_request(format!("`open_for`: `{d}` is not a duration such as 1h: {e}")))?,
    };
    let reason = Reason::new(&b.reason, Inputs::Json)?;
    Ok(Json(operator(&s, &caller).open_replay(&name, published, open_for, reason).await?))
}

/// The replay window `id` of a route the caller may see, or the 404 of a missing one.
async fn visible_replay(s: &InboxState, caller: &Caller, id: i64) -> Result<crate::inbox::ReplayWindow, ApiError> {
    match s.store.replay_window(id).await? {
        Some(w) if caller.may_see(&w.route) => Ok(w),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no replay window {id}"))),
    }
}

/// A replay window and the entries it made.
pub async fn replay(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
) -> Result<Json<ReplayEntries>, ApiError> {
    caller.require(Action::Read)?;
    let window = visible_replay(&s, &caller, id).await?;
    Ok(Json(ReplayEntries::of(s.store.as_ref(), window).await?))
}

/// Closes a replay window before its time ([`Operator::close_replay`]).
pub async fn close_replay(
    State(s): State<InboxState>,
    Extension(caller): Extension<Caller>,
    Id(id): Id<i64>,
) -> Result<Json<crate::inbox::ReplayWindow>, ApiError> {
    caller.require(Action::Replay)?;
    visible_replay(&s, &caller, id).await?;
    Ok(Json(operator(&s, &caller).close_replay(id).await?))
}

/// Applies changed routing and plugin files now; answers the reload report
/// (`crate::reload::reload_now`, documented in API.md).
pub async fn reload(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Action::Reload)?;
    let report = crate::reload::reload_now(&s).await;
    let refused = report["routing_file"]["result"] == "refused"
        || report["plugins"].as_object().is_some_and(|p| p.values().any(|v| v["result"] == "refused"));
    operator(&InboxState::from_ref(&s), &caller).record_reload(refused, report.to_string()).await;
    Ok(Json(report))
}
