//! The admin HTTP API: inspect and repair the inbox, metrics, health.
//!
//! - `GET  /api/entries?route=&status=&key=&after=&limit=`
//! - `GET  /api/entries/{id}`
//! - `POST /api/entries/{id}/requeue` — a PARKED entry becomes due now
//! - `POST /api/entries/{id}/park` — body `{"reason": "…"}`
//! - `POST /api/reload` — apply a changed routing file and plugin files now
//! - `GET  /api/routes` — each route: state (`up` or `refused`), routing file, source,
//!   plugin file and digest, error; and routing files refused whole
//! - `GET  /metrics`, `GET /healthz` (process up), `GET /readyz` (inbox reachable)
//!
//! Readiness: `/readyz` answers 200 while the inbox answers, even with some routes
//! refused — the healthy routes run, and restarting would not fix a team's broken file.
//! Its JSON says `"status": "degraded"` and lists the refused routes with their reasons;
//! it answers 503 only when the inbox does not.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::app::Shared;
use crate::inbox::{Entry, ListFilter, Status, StoreError};

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

fn store_error(e: StoreError) -> Response {
    let code = if e.is_transient() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
    (code, Json(json!({ "error": e.to_string() }))).into_response()
}

pub async fn list(State(s): State<Arc<Shared>>, Query(q): Query<ListQuery>) -> Response {
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
    match s.store.list(&filter).await {
        Ok(entries) => Json(json!({ "entries": entries.iter().map(entry_view).collect::<Vec<_>>() })).into_response(),
        Err(e) => store_error(e),
    }
}

pub async fn show(State(s): State<Arc<Shared>>, Path(id): Path<i64>) -> Response {
    match s.store.get(id).await {
        Ok(Some(e)) => Json(entry_view(&e)).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no entry {id}") }))).into_response(),
        Err(e) => store_error(e),
    }
}

pub async fn requeue(State(s): State<Arc<Shared>>, Path(id): Path<i64>) -> Response {
    match s.store.requeue(id, s.clock.now()).await {
        Ok(true) => {
            if let Ok(Some(e)) = s.store.get(id).await
                && let Some(route) = s.routes().get(&e.route)
            {
                route.stored.notify_one();
            }
            tracing::info!(id, "entry requeued through the admin API");
            Json(json!({ "requeued": id })).into_response()
        }
        Ok(false) => {
            (StatusCode::CONFLICT, Json(json!({ "error": format!("entry {id} is missing or not PARKED/OPEN") })))
                .into_response()
        }
        Err(e) => store_error(e),
    }
}

#[derive(Debug, Deserialize)]
pub struct ParkBody {
    pub reason: String,
}

pub async fn park(State(s): State<Arc<Shared>>, Path(id): Path<i64>, Json(b): Json<ParkBody>) -> Response {
    match s.store.park(id, &format!("parked by hand: {}", b.reason), s.clock.now()).await {
        Ok(true) => Json(json!({ "parked": id })).into_response(),
        Ok(false) => (StatusCode::CONFLICT, Json(json!({ "error": format!("entry {id} is missing or not OPEN") })))
            .into_response(),
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
pub async fn routes(State(s): State<Arc<Shared>>) -> Response {
    let routes = s.routes();
    let mut list = Vec::new();
    for r in routes.iter() {
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
            files.push(json!({ "file": p.file.display().to_string(), "error": p.error }));
            continue;
        };
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

pub async fn reload(State(s): State<Arc<Shared>>) -> Response {
    let report = crate::reload::reload_now(&s).await;
    Json(report).into_response()
}
