//! Repair by filter over the admin API ([`crate::operate::jobs`]):
//!
//! - `POST /api/repairs` — body `{"action": "requeue"|"park"|"ignore", "route": …, "key": …,
//!   "fingerprint": …, "text": …, "received_after": MS, "received_before": MS,
//!   "now": bool, "reason": …, "rate": N, "dry_run": bool}`. A dry run answers
//!   `{"dry_run": true, "matches": {"count", "keys", "distinct_keys"}}` and moves
//!   nothing; otherwise `{"job": ID, "matches": …}` (202): the job runs in the server
//!   at `rate` entries per second (default 100).
//! - `GET /api/repairs?limit=` — jobs, newest first, with their progress.
//!
//! The action's role applies (operator); a token limited to some routes must name
//! one of them in `route`. `fingerprint` may be `entry:ID`, as in `GET /api/entries`.
//! A token without `payloads` may not filter by `text` nor by a fingerprint other
//! than `entry:ID`, and reads the jobs' `text` and `fingerprint` withheld ([`Reader`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;

use super::access::{Action, Caller};
use super::answer::{ApiError, Body, Params, Reader};
use super::store_error;
use crate::inbox::repair::{RepairAction, RepairFilter};
use crate::operate::jobs;
use crate::operate::{Inputs, JobPlan};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairRequest {
    pub action: RepairAction,
    #[serde(flatten)]
    pub filter: RepairFilter,
    pub reason: Option<String>,
    pub rate: Option<u32>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /api/repairs`: access is checked here (the action's role, `text` only with
/// payloads, a route the token covers); the rate and reason are the job's rules
/// ([`JobPlan`]), and the job is started and audited by [`Operator::start_job`].
pub async fn create(
    State(s): State<super::InboxState>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<RepairRequest>,
) -> Response {
    if let Err(r) = caller.require(Action::from(req.action)) {
        return r.into_response();
    }
    if let Err(refused) = Reader::of(&caller).search(req.filter.text.as_deref()) {
        return refused.into_response();
    }
    match &req.filter.route {
        Some(route) if !caller.may_see(route) => {
            return (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no route {route}") }))).into_response();
        }
        None if !caller.may_see_all() => {
            return (
                StatusCode::FORBIDDEN,
                Json(json!({ "error": format!("token `{}` is limited to some routes: name one in `route`", caller.name) })),
            )
                .into_response();
        }
        _ => {}
    }
    // The filter as asked is what the answer repeats: `entry:ID` stays that.
    let asked = req.filter.clone();
    let mut req = req;
    match super::group_fingerprint(&s, &caller, req.filter.fingerprint.as_deref()).await {
        Ok(fingerprint) => req.filter.fingerprint = fingerprint,
        Err(refused) => return refused.into_response(),
    }
    let rate = req.rate.unwrap_or(jobs::DEFAULT_RATE);
    let plan = match JobPlan::new(req.action, req.reason.as_deref(), rate, Inputs::Json) {
        Ok(plan) => plan,
        Err(refused) => return ApiError::from(refused).into_response(),
    };
    let matches = match jobs::dry_run(s.store.as_ref(), req.action, &req.filter).await {
        Ok(m) => m,
        Err(e) => return store_error(e),
    };
    if req.dry_run {
        return Json(json!({ "dry_run": true, "action": req.action, "filter": asked, "matches": matches }))
            .into_response();
    }
    match super::operator(&s, &caller).start_job(&plan, &req.filter, &matches).await {
        Ok(job) => {
            (StatusCode::ACCEPTED, Json(json!({ "job": job, "rate": rate, "matches": matches }))).into_response()
        }
        Err(refused) => ApiError::from(refused).into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsQuery {
    pub limit: Option<u32>,
}

pub async fn list(
    State(s): State<super::InboxState>,
    Extension(caller): Extension<Caller>,
    Params(q): Params<JobsQuery>,
) -> Response {
    if let Err(r) = caller.require(Action::Read) {
        return r.into_response();
    }
    let reader = Reader::of(&caller);
    match s.store.list_repair_jobs(q.limit.unwrap_or(50).clamp(1, 1000)).await {
        Ok(jobs) => {
            let visible: Vec<_> = jobs
                .into_iter()
                .filter(|j| j.filter.route.as_deref().map_or(caller.may_see_all(), |r| caller.may_see(r)))
                .map(|j| reader.repair_job(j))
                .collect();
            Json(json!({ "jobs": visible })).into_response()
        }
        Err(e) => store_error(e),
    }
}
