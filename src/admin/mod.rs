//! The admin HTTP API: inspect and repair the inbox, metrics, health.
//!
//! - `GET  /api/entries?route=&status=&key=&after=&limit=`
//! - `GET  /api/entries/{id}`
//! - `POST /api/entries/{id}/requeue` — a PARKED entry becomes due now
//! - `POST /api/entries/{id}/park` — body `{"reason": "…"}`
//! - `POST /api/reload` — apply a changed routing file and plugin files now
//! - `GET  /metrics`, `GET /healthz` (process up), `GET /readyz` (inbox reachable)

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
    match s.store.db_now().await {
        Ok(_) => "ready".into_response(),
        Err(e) => store_error(e),
    }
}

pub async fn reload(State(s): State<Arc<Shared>>) -> Response {
    let report = crate::reload::reload_now(&s).await;
    Json(report).into_response()
}
