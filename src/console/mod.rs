//! The web console: server-rendered pages over the admin API, on the admin listener
//! under `/console`.
//!
//! - `GET  /console` — routes: backlog per state, oldest unresolved age, entries
//!   delivered per minute over the last hour (a sparkline), pause state, open replay
//!   windows; pause and resume
//! - `POST /console/replays/{id}/close` — ends an open replay window early
//! - `GET  /console/failures` — failure groups; each opens the entry list filtered to it
//! - `GET  /console/entries?route=&status=&key=&fingerprint=&text=&after=` — entries,
//!   and the bulk repair of everything the filter matches
//! - `GET  /console/entries/{id}` — one entry: payload as text, JSON and hex,
//!   attributes, attempt history; requeue, park, ignore
//! - `POST /console/repairs` — a repair by filter: first a dry run (`step=preview`)
//!   that shows what would move, then the job (`step=start`)
//! - `GET  /console/repairs` — repair jobs and their progress
//! - `GET  /console/audit?after=` — the audit log (admins, as in the API)
//! - `GET  /console/routes/{name}/shadow` — a route's candidate plugin in shadow: what
//!   it answered differently, with samples of both sides; promote and roll back
//! - `GET/POST /console/login`, `POST /console/logout`, `GET /console/style.css`
//!
//! Every page and action runs the admin API's own handler for it with the signed-in
//! token's [`Caller`](crate::admin::access::Caller), so role checks, route scopes,
//! payload withholding (payloads and the error texts that may quote them,
//! [`Reader`](crate::admin::answer::Reader)) and the audit log are the API's, not a copy. Buttons a token
//! may not use are not shown ([`Caller::may`](crate::admin::access::Caller::may)), and
//! a forged POST still meets the API's 403. Sessions, the cookie and CSRF are in
//! [`session`]; escaping in [`html`].

pub mod html;
pub mod session;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use self::html::{SignedIn, esc, hidden, query, status_badge, time};
use self::session::{Posted, Sessions, Signed};
use crate::admin::access::{Action, find_token};
use crate::admin::answer::{ApiError, Body, Id, Params, Payload};
use crate::admin::{self, InboxState, ReasonBody};
use crate::guesses::Checked;
use crate::inbox::repair::{JobState, RepairAction, RepairFilter, RepairJob};
use crate::inbox::{ListFilter, Status};
use crate::shared::Shared;
use crate::telemetry::SignInLabels;

/// The console's state: what the API handlers share, and the sign-in sessions.
pub struct Console {
    pub shared: Arc<Shared>,
    pub sessions: Sessions,
}

impl Console {
    /// What the API's entry, audit and operator handlers take.
    fn inbox(&self) -> InboxState {
        InboxState::from_ref(&self.shared)
    }
}

const STYLE: &str = include_str!("console.css");
/// Entries per page of the entry list.
const PAGE: u32 = 50;
/// The sparkline: this many buckets of this many milliseconds, the last one the
/// current minute.
const SPARK_BUCKETS: i64 = 60;
const SPARK_BUCKET_MS: i64 = 60_000;

/// The console's routes, each behind its session check (see [`session`]), with
/// headers that keep its pages from being framed, cached or scripted.
pub fn router(shared: &Arc<Shared>) -> Router {
    let console = Arc::new(Console { shared: Arc::clone(shared), sessions: Sessions::default() });
    Router::new()
        .route("/console", get(overview))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/style.css", get(style))
        .route("/console/failures", get(failures))
        .route("/console/entries", get(entries))
        .route("/console/entries/{id}", get(entry))
        .route("/console/entries/{id}/{action}", post(entry_action))
        .route("/console/repairs", get(jobs).post(repair))
        .route("/console/audit", get(audit))
        .route("/console/routes/{name}/{action}", post(route_action))
        .route("/console/routes/{name}/shadow", get(shadow))
        .route("/console/replays/{id}/close", post(replay_close))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(console)
}

async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name: &'static str, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, "x-frame-options", "DENY");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "same-origin");
    if !h.contains_key(header::CACHE_CONTROL) {
        set(h, "cache-control", "no-store");
    }
    r
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=300")], STYLE).into_response()
}

/// An HTML answer.
fn html(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

impl Signed {
    fn signed_in(&self) -> SignedIn<'_> {
        SignedIn {
            name: &self.caller.name,
            role: self.caller.role.as_str(),
            csrf: &self.csrf,
            audit: self.caller.may(Action::ReadAudit),
        }
    }

    /// A page for this user, with the message the last action left.
    fn page(&self, title: &str, body: &str) -> Response {
        html(StatusCode::OK, html::page(title, Some(&self.signed_in()), self.flash.as_deref(), body))
    }

    /// The API's refusal as a page, with its status code.
    fn refused(&self, e: ApiError) -> Response {
        let body = format!(
            r#"<p class="error" id="error">{}</p><p><a href="/console">Back to the routes</a></p>"#,
            esc(&e.body.error)
        );
        html(
            e.code,
            html::page(
                &format!("{} {}", e.code.as_u16(), e.code.canonical_reason().unwrap_or("")),
                Some(&self.signed_in()),
                None,
                &body,
            ),
        )
    }

    /// The form field every POST carries.
    fn csrf_field(&self) -> String {
        hidden("csrf", &self.csrf)
    }
}

/// The status and JSON of an API handler that answers a `Response`.
async fn json_of(r: Response) -> (StatusCode, serde_json::Value) {
    let code = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), 16 * 1024 * 1024).await.unwrap_or_default();
    (code, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

/// An API answer that is not 2xx, as an [`ApiError`].
fn api_error(code: StatusCode, body: &serde_json::Value) -> ApiError {
    ApiError::new(code, body["error"].as_str().unwrap_or("the request was refused").to_string())
}

// ---------------------------------------------------------------------------------------
// Signing in and out
// ---------------------------------------------------------------------------------------

fn login_form(problem: Option<&str>, shared: &Shared) -> String {
    let no_tokens = shared.config.lock().expect("config lock").admin.tokens.is_empty();
    let hint = if no_tokens {
        r#"<p class="notice">No <code>[[admin.token]]</code> is configured, so nobody can sign in. The console takes the same tokens as the admin API (SECURITY.md).</p>"#
    } else {
        ""
    };
    let problem = problem.map(|p| format!(r#"<p class="error" id="error">{}</p>"#, esc(p))).unwrap_or_default();
    let body = format!(
        r#"{hint}{problem}<form method="post" action="/console/login" class="login"><label>Admin token <input type="password" name="token" autocomplete="current-password" required autofocus></label><button type="submit" id="sign-in">Sign in</button></form><p class="muted">The token is the one the admin API takes (<code>Authorization: Bearer …</code>); its role and routes apply here too.</p>"#
    );
    html::page("Sign in", None, None, &body)
}

async fn login_page(State(c): State<Arc<Console>>) -> Response {
    html(StatusCode::OK, login_form(None, &c.shared))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(c): State<Arc<Console>>,
    extensions: axum::http::Extensions,
    headers: axum::http::HeaderMap,
    form: axum::Form<LoginForm>,
) -> Response {
    if session::cross_site(&headers) {
        tracing::warn!("console sign-in refused: the request comes from another site");
        return html(
            StatusCode::FORBIDDEN,
            login_form(Some("refused: the request comes from another site"), &c.shared),
        );
    }
    let token = form.token.trim();
    let admin = c.shared.config.lock().expect("config lock").admin.clone();
    // The peer, as the listener recorded it (`crate::server`), for the backoff.
    let peer = extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|p| p.0);
    let caller = match c.shared.guesses.check(&c.shared.metrics, "console", peer, || find_token(&admin, token)) {
        Checked::Found(caller) => caller,
        Checked::Unknown => return html(StatusCode::UNAUTHORIZED, login_form(Some("unknown token"), &c.shared)),
        Checked::Wait(secs) => {
            let problem = format!("too many unknown tokens from this address: try again in {secs} s");
            let mut r = html(StatusCode::TOO_MANY_REQUESTS, login_form(Some(&problem), &c.shared));
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return r;
        }
    };
    let Ok(id) = c.sessions.start(token) else {
        let label = SignInLabels { via: "console", reason: "too_many_sessions" };
        c.shared.metrics.sign_in_refused.get_or_create(&label).inc();
        tracing::warn!(caller = %caller.name, "console sign-in refused: the console holds its maximum of sessions");
        let problem = "the console holds as many sessions as it can; try again later";
        return html(StatusCode::SERVICE_UNAVAILABLE, login_form(Some(problem), &c.shared));
    };
    tracing::info!(caller = %caller.name, role = caller.role.as_str(), "console sign-in");
    let mut r = Redirect::to("/console").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::cookie(&id)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn logout(State(c): State<Arc<Console>>, posted: Posted) -> Response {
    c.sessions.end(&posted.signed.session);
    let mut r = Redirect::to("/console/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clearing_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

// ---------------------------------------------------------------------------------------
// Routes overview, pause and resume
// ---------------------------------------------------------------------------------------

async fn overview(State(c): State<Arc<Console>>, signed: Signed) -> Response {
    let s = &c.shared;
    let caller = &signed.caller;
    let list = match admin::routes(State(Arc::clone(s)), Extension(caller.clone())).await {
        Ok(Json(list)) => list,
        Err(e) => return signed.refused(e),
    };
    let now = s.clock.now();
    // Whole minutes, the current one last.
    let since = now - now.rem_euclid(SPARK_BUCKET_MS) - (SPARK_BUCKETS - 1) * SPARK_BUCKET_MS;
    let (counts, throughput) = match (s.store.counts().await, s.store.throughput(since, SPARK_BUCKET_MS).await) {
        (Ok(c), Ok(t)) => (c, t),
        (Err(e), _) | (_, Err(e)) => return signed.refused(ApiError::store(e)),
    };
    let replays = match s.store.replay_windows(None, Some(now)).await {
        Ok(windows) => windows,
        Err(e) => return signed.refused(ApiError::store(e)),
    };
    let mut by_route: BTreeMap<&str, (i64, i64, i64, Option<i64>)> = BTreeMap::new();
    for count in counts.iter().filter(|c| caller.may_see(&c.route)) {
        let row = by_route.entry(count.route.as_str()).or_default();
        match count.status {
            Status::Open => row.0 += count.count,
            Status::InProgress => row.1 += count.count,
            Status::Parked => row.2 += count.count,
            _ => {}
        }
        if let Some(oldest) = count.oldest_received_at {
            row.3 = Some(row.3.map_or(oldest, |o: i64| o.min(oldest)));
        }
    }
    let mut spark: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for t in throughput.iter().filter(|t| caller.may_see(&t.route)) {
        let buckets = spark.entry(t.route.as_str()).or_insert_with(|| vec![0; SPARK_BUCKETS as usize]);
        if let Some(slot) = usize::try_from(t.bucket).ok().and_then(|b| buckets.get_mut(b)) {
            *slot += t.done;
        }
    }
    let may_pause = caller.may(Action::Pause);
    let may_replay = caller.may(Action::Replay);
    let mut rows = String::new();
    for r in &list.routes {
        let (open, in_progress, parked, oldest) = by_route.get(r.name.as_str()).copied().unwrap_or_default();
        let counts = spark.get(r.name.as_str()).cloned().unwrap_or_else(|| vec![0; SPARK_BUCKETS as usize]);
        let delivered: i64 = counts.iter().sum();
        let name = esc(&r.name);
        let route_q = query(&[("route", Some(&r.name))]);
        let state = match (&r.paused, r.state) {
            (Some(p), _) => {
                format!(r#"<span class="badge paused">paused</span> <span class="muted">{}</span>"#, esc(&p.sentence()))
            }
            (None, "up") => r#"<span class="badge done">running</span>"#.to_string(),
            (None, other) => format!(r#"<span class="badge parked">{}</span>"#, esc(other)),
        };
        let error =
            r.error.as_deref().map(|e| format!(r#"<div class="error small">{}</div>"#, esc(e))).unwrap_or_default();
        let rollout = match (&r.candidate, &r.previous) {
            (None, None) => String::new(),
            (candidate, previous) => format!(
                r#"<div class="small"><a href="/console/routes/{n}/shadow">{what}</a></div>"#,
                n = html::url_param(&r.name),
                what = esc(&match (candidate, previous) {
                    (Some(c), _) => format!("candidate in shadow: {c}"),
                    (None, Some(p)) => format!("promoted; previous: {p}"),
                    (None, None) => unreachable!("matched above"),
                }),
            ),
        };
        let replay: String = replays
            .iter()
            .filter(|w| w.route == r.name)
            .map(|w| {
                // Ending a window early: its later redeliveries are duplicates again.
                let close = if may_replay {
                    format!(
                        r#" <form method="post" action="/console/replays/{id}/close" class="write inline">{csrf}<button type="submit" class="write">Close</button></form>"#,
                        id = w.id,
                        csrf = signed.csrf_field()
                    )
                } else {
                    String::new()
                };
                format!(
                    r#"<div class="small">replay window {id} open until {until}: redeliveries of messages published {from} to {to} are stored again ({taken} so far){close}</div>"#,
                    id = w.id,
                    until = esc(&crate::clock::rfc3339_millis(w.closes_at)),
                    from = esc(&crate::clock::rfc3339_millis(w.published_from)),
                    to = esc(&crate::clock::rfc3339_millis(w.published_to)),
                    taken = w.taken,
                )
            })
            .collect();
        // What the route takes of a subscription it shares with other routes.
        let select = r
            .select
            .as_deref()
            .map(|s| format!(r#"<div class="small muted">takes messages with {}</div>"#, esc(s)))
            .unwrap_or_default();
        let error = format!("{select}{rollout}{replay}{error}");
        let action = if !may_pause {
            String::new()
        } else if r.paused.is_some() {
            format!(
                r#"<form method="post" action="/console/routes/{n}/resume" class="write inline">{csrf}<button type="submit" class="write">Resume</button></form>"#,
                n = html::url_param(&r.name),
                csrf = signed.csrf_field()
            )
        } else {
            format!(
                r#"<form method="post" action="/console/routes/{n}/pause" class="write inline">{csrf}<input name="reason" placeholder="reason" required><button type="submit" class="write">Pause</button></form>"#,
                n = html::url_param(&r.name),
                csrf = signed.csrf_field()
            )
        };
        let _ = write!(
            rows,
            r#"<tr data-route="{name}"><td><a href="/console/entries{route_q}">{name}</a><div class="muted small">{source} · {file}</div>{error}</td><td>{state}</td><td class="num"><a href="/console/entries{open_q}">{open}</a></td><td class="num">{in_progress}</td><td class="num parked-count"><a href="/console/entries{parked_q}">{parked}</a></td><td>{oldest}</td><td>{spark}<div class="muted small">{delivered} in the last hour</div></td><td>{action}</td></tr>"#,
            source = esc(r.source.unwrap_or("?")),
            file = esc(&r.file),
            open_q = query(&[("route", Some(&r.name)), ("status", Some("open"))]),
            parked_q = query(&[("route", Some(&r.name)), ("status", Some("parked"))]),
            oldest = oldest.map(|o| html::age(now - o)).unwrap_or_else(|| "—".into()),
            spark = html::sparkline(&counts, "delivered in the last hour"),
        );
    }
    let refused: String = list
        .refused_files
        .iter()
        .map(|f| format!(r#"<li><code>{}</code>: {}</li>"#, esc(&f.file), esc(&f.error)))
        .collect();
    let refused = if refused.is_empty() {
        String::new()
    } else {
        format!(r#"<h2>Routing files refused</h2><ul class="error">{refused}</ul>"#)
    };
    let body = format!(
        r#"<table class="routes"><thead><tr><th>Route</th><th>State</th><th class="num">Open</th><th class="num">In progress</th><th class="num">Parked</th><th>Oldest unresolved</th><th>Delivered per minute</th><th></th></tr></thead><tbody>{rows}</tbody></table>{refused}"#
    );
    signed.page("Routes", &body)
}

async fn route_action(
    State(c): State<Arc<Console>>,
    Path((name, action)): Path<(String, String)>,
    posted: Posted,
) -> Response {
    let s = Arc::clone(&c.shared);
    let signed = &posted.signed;
    let caller = Extension(signed.caller.clone());
    let result = match action.as_str() {
        "pause" => {
            let reason = posted.field("reason").unwrap_or_default();
            let body = Body(ReasonBody { reason });
            admin::pause_route(State(c.inbox()), caller, Id(name.clone()), body).await.map(|_| "paused")
        }
        "resume" => admin::resume_route(State(c.inbox()), caller, Id(name.clone())).await.map(|_| "resumed"),
        "promote" => admin::promote(State(s), caller, Id(name.clone())).await.map(|_| "promoted: its candidate serves"),
        "rollback" => admin::rollback(State(s), caller, Id(name.clone()))
            .await
            .map(|_| "rolled back: its previous version serves"),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no route action `{action}`"))),
    };
    match result {
        Ok(done) => {
            c.sessions.flash(&signed.session, format!("Route {name} {done}."));
            Redirect::to("/console").into_response()
        }
        Err(e) => signed.refused(e),
    }
}

/// Closes an open replay window before its time, through the API's handler (its
/// role check, route scope and audit).
async fn replay_close(State(c): State<Arc<Console>>, Path(id): Path<i64>, posted: Posted) -> Response {
    let signed = &posted.signed;
    let caller = Extension(signed.caller.clone());
    match admin::close_replay(State(c.inbox()), caller, Id(id)).await {
        Ok(_) => {
            c.sessions
                .flash(&signed.session, format!("Replay window {id} closed: its redeliveries are duplicates again."));
            Redirect::to("/console").into_response()
        }
        Err(e) => signed.refused(e),
    }
}

/// A route's shadow: counts by call and part, the candidate's faults and dropped work,
/// the recent differences with both sides (as the caller may read them), and the
/// promote and roll back buttons for who may use them.
async fn shadow(State(c): State<Arc<Console>>, signed: Signed, Path(name): Path<String>) -> Response {
    let s = Arc::clone(&c.shared);
    let caller = Extension(signed.caller.clone());
    let declared = s
        .config
        .lock()
        .expect("config lock")
        .route(&name)
        .filter(|_| signed.caller.may_see(&name))
        .map(|r| r.previous.is_some());
    let report = match admin::shadow(State(s), caller, Id(name.clone())).await {
        Ok(Json(report)) => Some(report),
        // A promoted route has no candidate; it may still roll back.
        Err(e) if e.code == StatusCode::NOT_FOUND && declared.is_some() => None,
        Err(e) => return signed.refused(e),
    };
    let n = html::url_param(&name);
    let mut body = String::new();
    match &report {
        None => body.push_str(r#"<p class="muted">This route runs no candidate.</p>"#),
        Some(r) => {
            let state = match &r.refused {
                Some(why) => format!(
                    r#"<span class="badge parked">refused</span> <span class="error small">{}</span>"#,
                    esc(why)
                ),
                None => r#"<span class="badge done">compared</span>"#.to_string(),
            };
            let _ = write!(
                body,
                r#"<p>Candidate <code>{cand}</code> {state}<br><span class="muted small">sha256 {digest} · since {since} · nothing it renders is sent</span></p>"#,
                cand = esc(&r.candidate),
                digest = esc(r.candidate_sha256.as_deref().unwrap_or("—")),
                since = esc(&time(r.since)),
            );
            let mut rows = String::new();
            for (call, counts) in
                [("decode", &r.counts.decode), ("render", &r.counts.render), ("classify", &r.counts.classify)]
            {
                let parts: Vec<String> = counts.parts.iter().map(|(p, k)| format!("{p} {k}")).collect();
                let faults: Vec<String> = counts.faults.iter().map(|(f, k)| format!("{f} {k}")).collect();
                let _ = write!(
                    rows,
                    r#"<tr data-call="{call}"><td>{call}</td><td class="num">{compared}</td><td class="num">{differing}</td><td>{parts}</td><td>{faults}</td></tr>"#,
                    compared = counts.compared,
                    differing = counts.differing,
                    parts = esc(&parts.join(", ")),
                    faults = esc(&faults.join(", ")),
                );
            }
            let _ = write!(
                body,
                r#"<table class="shadow"><thead><tr><th>Call</th><th class="num">Compared</th><th class="num">Differing</th><th>Parts</th><th>Candidate faults</th></tr></thead><tbody>{rows}</tbody></table><p class="muted small">Dropped while the candidate was behind: {dropped}</p>"#,
                dropped = r.counts.dropped,
            );
            let mut samples = String::new();
            for sample in r.samples.iter().rev() {
                let about = match (sample.entry, &sample.message_id) {
                    (Some(id), _) => format!(r#"<a href="/console/entries/{id}">entry {id}</a>"#),
                    (None, Some(m)) => format!("message {}", esc(m)),
                    (None, None) => String::new(),
                };
                let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
                let _ = write!(
                    samples,
                    r#"<tr class="sample"><td>{at}</td><td>{call}</td><td>{about}</td><td>{parts}</td><td><pre>{ours}</pre></td><td><pre>{theirs}</pre></td></tr>"#,
                    at = esc(&time(sample.at)),
                    call = sample.call.as_str(),
                    parts = esc(&sample.parts.join(", ")),
                    ours = esc(&pretty(&sample.serving)),
                    theirs = esc(&pretty(&sample.candidate)),
                );
            }
            if !samples.is_empty() {
                let _ = write!(
                    body,
                    r#"<h2>Recent differences</h2><table class="samples"><thead><tr><th>At</th><th>Call</th><th>About</th><th>Parts</th><th>Serving</th><th>Candidate</th></tr></thead><tbody>{samples}</tbody></table>"#
                );
            }
        }
    }
    let csrf = signed.csrf_field();
    if report.as_ref().is_some_and(|r| r.state == "running") && signed.caller.may(Action::Promote) {
        let _ = write!(
            body,
            r#"<form method="post" action="/console/routes/{n}/promote" class="write inline">{csrf}<button type="submit" class="write">Promote the candidate</button></form> "#
        );
    }
    if declared == Some(true) && signed.caller.may(Action::Rollback) {
        let _ = write!(
            body,
            r#"<form method="post" action="/console/routes/{n}/rollback" class="write inline">{csrf}<button type="submit" class="write">Roll back to the previous version</button></form>"#
        );
    }
    body.push_str(r#"<p class="muted small">Promotion and rollback rewrite the route's lines in its routing file, which stays the source of truth, and are recorded in the audit log.</p>"#);
    signed.page(&format!("Shadow of {name}"), &body)
}

// ---------------------------------------------------------------------------------------
// Failure groups
// ---------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct RouteQuery {
    route: Option<String>,
}

/// A query-string value, `None` when empty.
fn given(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string)
}

/// Text cut to `n` characters, with an ellipsis.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

async fn failures(State(c): State<Arc<Console>>, signed: Signed, Query(q): Query<RouteQuery>) -> Response {
    let route = given(&q.route);
    let asked = admin::FailuresQuery { route: route.clone(), limit: Some(200) };
    let groups = match admin::failures(State(c.inbox()), Extension(signed.caller.clone()), Params(asked)).await {
        Ok(Json(g)) => g.groups,
        Err(e) => return signed.refused(e),
    };
    let mut rows = String::new();
    for g in &groups {
        let link = query(&[("route", Some(&g.route)), ("fingerprint", Some(&g.fingerprint))]);
        let _ = write!(
            rows,
            r#"<tr class="group"><td>{route}</td><td><a class="group-link" href="/console/entries{link}"><code>{fp}</code></a><div class="muted small">e.g. <a href="/console/entries/{ex}">entry {ex}</a>: {err}</div></td><td class="num">{parked}</td><td class="num">{retrying}</td><td class="num">{keys}</td><td>{first}</td><td>{last}</td></tr>"#,
            route = esc(&g.route),
            fp = esc(&g.fingerprint),
            ex = g.example_id,
            err = esc(&cut(&g.example_error, 200)),
            parked = g.parked,
            retrying = g.retrying,
            keys = g.keys,
            first = esc(&time(g.first_seen)),
            last = esc(&time(g.last_seen)),
        );
    }
    let table = if groups.is_empty() {
        r#"<p class="muted" id="no-failures">No parked or retrying entries.</p>"#.to_string()
    } else {
        format!(
            r#"<table class="groups"><thead><tr><th>Route</th><th>Error (fingerprint)</th><th class="num">Parked</th><th class="num">Retrying</th><th class="num">Keys</th><th>First seen</th><th>Last seen</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    };
    let body = format!(
        r#"<form method="get" action="/console/failures" class="filters"><label>Route <input name="route" value="{route}"></label><button type="submit">Filter</button></form><p class="muted">Parked and retrying entries grouped by route and error, numbers, ids and quoted values masked. Open a group to see its entries and repair them.</p>{table}"#,
        route = esc(route.as_deref().unwrap_or("")),
    );
    signed.page("Failure groups", &body)
}

// ---------------------------------------------------------------------------------------
// Entries
// ---------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct EntriesQuery {
    route: Option<String>,
    status: Option<String>,
    key: Option<String>,
    fingerprint: Option<String>,
    text: Option<String>,
    after: Option<String>,
}

/// How many entries the filter matches among the routes the caller may see (the
/// API's list scoping, for a count).
async fn count_visible(
    s: &InboxState,
    caller: &crate::admin::access::Caller,
    filter: ListFilter,
) -> Result<u64, ApiError> {
    let Some(allowed) = &caller.routes else { return Ok(s.store.count(&filter).await?) };
    let routes: Vec<String> = match &filter.route {
        Some(r) => allowed.contains(r).then(|| r.clone()).into_iter().collect(),
        None => allowed.iter().cloned().collect(),
    };
    let mut total = 0;
    for route in routes {
        total += s.store.count(&ListFilter { route: Some(route), ..filter.clone() }).await?;
    }
    Ok(total)
}

async fn entries(State(c): State<Arc<Console>>, signed: Signed, Query(q): Query<EntriesQuery>) -> Response {
    let s = &c.inbox();
    let caller = &signed.caller;
    let (route, status, key, fingerprint, text) =
        (given(&q.route), given(&q.status), given(&q.key), given(&q.fingerprint), given(&q.text));
    let after = match given(&q.after).map(|a| a.parse::<i64>()).transpose() {
        Ok(a) => a,
        Err(_) => return signed.refused(ApiError::bad_request("`after` must be an entry id")),
    };
    let parsed_status = match status.as_deref().map(str::parse::<Status>).transpose() {
        Ok(st) => st,
        Err(e) => return signed.refused(ApiError::bad_request(e)),
    };
    let asked = admin::ListQuery {
        route: route.clone(),
        status: status.clone(),
        key: key.clone(),
        fingerprint: fingerprint.clone(),
        text: text.clone(),
        after,
        limit: Some(PAGE),
    };
    let page = match admin::list(State(s.clone()), Extension(caller.clone()), Params(asked)).await {
        Ok(Json(p)) => p,
        Err(e) => return signed.refused(e),
    };
    let group = match admin::group_fingerprint(s, caller, fingerprint.as_deref()).await {
        Ok(g) => g,
        Err(e) => return signed.refused(e),
    };
    let filter = ListFilter {
        route: route.clone(),
        status: parsed_status,
        correlation_key: key.clone(),
        fingerprint: group,
        error_text: text.clone(),
        after_id: None,
        limit: PAGE,
        newest_first: false,
    };
    let total = match count_visible(s, caller, filter).await {
        Ok(n) => n,
        Err(e) => return signed.refused(e),
    };
    let now = s.clock.now();
    let mut rows = String::new();
    for v in &page.entries {
        let e = &v.entry;
        let _ = write!(
            rows,
            r#"<tr class="entry" data-status="{st}"><td class="num"><a href="/console/entries/{id}">{id}</a></td><td>{route}</td><td><code>{key}</code></td><td>{badge}</td><td class="num">{attempts}</td><td class="small">{err}</td><td>{received}<div class="muted small">{age} ago</div></td></tr>"#,
            id = e.id,
            st = e.status.as_str(),
            route = esc(&e.route),
            key = esc(e.correlation_key.as_deref().unwrap_or("—")),
            badge = status_badge(e.status.as_str()),
            attempts = e.attempts,
            err = esc(&cut(e.last_error.as_deref().unwrap_or(""), 160)),
            received = esc(&time(e.received_at)),
            age = html::age(now - e.received_at),
        );
    }
    let here = |after: Option<String>| {
        query(&[
            ("route", route.as_deref()),
            ("status", status.as_deref()),
            ("key", key.as_deref()),
            ("fingerprint", fingerprint.as_deref()),
            ("text", text.as_deref()),
            ("after", after.as_deref()),
        ])
    };
    let next = page
        .next_after
        .map(|n| {
            format!(r#"<p><a href="/console/entries{}" id="next-page">Next page</a></p>"#, here(Some(n.to_string())))
        })
        .unwrap_or_default();
    let status_options: String = std::iter::once(("", "any"))
        .chain(Status::ALL.iter().map(|s| (s.as_str(), s.as_str())))
        .map(|(v, label)| {
            let selected = if status.as_deref().is_some_and(|s| s.eq_ignore_ascii_case(v)) { " selected" } else { "" };
            format!(r#"<option value="{}"{selected}>{}</option>"#, esc(v), esc(label))
        })
        .collect();
    let fp_field = fingerprint
        .as_deref()
        .map(|f| format!(r#"<label>Failure group <input name="fingerprint" value="{}" size="50"></label>"#, esc(f)))
        .unwrap_or_default();
    // Error texts may quote payloads: a token without `payloads` may not search them.
    let text_field = if caller.payloads {
        format!(r#"<label>Error text <input name="text" value="{}"></label>"#, esc(text.as_deref().unwrap_or("")))
    } else {
        String::new()
    };
    let filters = format!(
        r#"<form method="get" action="/console/entries" class="filters"><label>Route <input name="route" value="{route}"></label><label>Status <select name="status">{status_options}</select></label><label>Key <input name="key" value="{key}"></label>{text_field}{fp_field}<button type="submit">Filter</button></form>"#,
        route = esc(route.as_deref().unwrap_or("")),
        key = esc(key.as_deref().unwrap_or("")),
    );
    let bulk = if caller.may(Action::Requeue) || caller.may(Action::Ignore) {
        let filter_fields: String = [("route", &route), ("key", &key), ("fingerprint", &fingerprint), ("text", &text)]
            .iter()
            .filter_map(|(n, v)| v.as_deref().map(|v| hidden(n, v)))
            .collect();
        format!(
            r#"<form method="post" action="/console/repairs" class="write bulk"><h2>Repair everything this filter matches</h2>{csrf}{filter_fields}{step}<label>Action <select name="action" id="bulk-action"><option value="requeue">requeue (PARKED entries)</option><option value="ignore">ignore (PARKED entries, with a reason)</option></select></label><label>Reason <input name="reason" placeholder="needed to ignore"></label><label>Rate <input name="rate" type="number" min="1" max="{max}" value="{rate}" size="6"> entries/s</label><label><input type="checkbox" name="now" value="1"> also OPEN entries waiting for a retry</label><button type="submit" class="write" id="preview">Preview (dry run)</button><p class="muted small">The status filter does not apply: requeue and ignore take PARKED entries. Nothing moves before you confirm.</p></form>"#,
            csrf = signed.csrf_field(),
            step = hidden("step", "preview"),
            max = crate::operate::jobs::MAX_RATE,
            rate = crate::operate::jobs::DEFAULT_RATE,
        )
    } else {
        String::new()
    };
    let body = format!(
        r#"{filters}<p><strong id="match-total">{total}</strong> entries match{shown}.</p><table class="entries"><thead><tr><th class="num">Id</th><th>Route</th><th>Key</th><th>State</th><th class="num">Attempts</th><th>Last error</th><th>Received</th></tr></thead><tbody>{rows}</tbody></table>{next}{bulk}"#,
        shown = if page.entries.is_empty() { String::new() } else { format!(", {} shown", page.entries.len()) },
    );
    signed.page("Entries", &body)
}

async fn entry(State(c): State<Arc<Console>>, signed: Signed, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return signed.refused(ApiError::new(StatusCode::NOT_FOUND, format!("no entry {id}")));
    };
    let caller = &signed.caller;
    let view = match admin::show(State(c.inbox()), Extension(caller.clone()), Id(id)).await {
        Ok(Json(v)) => v,
        Err(e) => return signed.refused(e),
    };
    let e = &view.entry;
    let opt = |v: &Option<String>| esc(v.as_deref().unwrap_or("—"));
    let when = |v: Option<i64>| v.map(|t| esc(&time(t))).unwrap_or_else(|| "—".into());
    let facts = [
        ("Route", esc(&e.route)),
        ("State", status_badge(e.status.as_str())),
        ("Correlation key", opt(&e.correlation_key)),
        ("Dedup key", esc(&e.dedup_key)),
        ("Event type", opt(&e.event_type)),
        ("Schema version", opt(&e.schema_version)),
        ("Message id", esc(&e.message_id)),
        ("Publish time", opt(&e.publish_time)),
        ("Delivery attempt (broker)", e.delivery_attempt.map(|d| d.to_string()).unwrap_or_else(|| "—".into())),
        ("Payload SHA-256", format!("<code>{}</code>", esc(&e.payload_digest))),
        (
            "Conflict of",
            e.conflict_of
                .map(|c| format!(r#"<a href="/console/entries/{c}">entry {c}</a>"#))
                .unwrap_or_else(|| "—".into()),
        ),
        ("Attempts (this run)", e.attempts.to_string()),
        ("Next attempt at", when(Some(e.next_attempt_at))),
        (
            "Lease",
            e.lease_owner
                .as_deref()
                .map(|o| format!("{} until {}", esc(o), when(e.lease_expires_at)))
                .unwrap_or_else(|| "—".into()),
        ),
        ("Received", when(Some(e.received_at))),
        ("Not yet since", when(e.not_yet_since)),
        ("Updated", when(Some(e.updated_at))),
        ("Finished", when(e.finished_at)),
    ];
    let facts: String = facts.iter().map(|(k, v)| format!("<tr><th>{k}</th><td>{v}</td></tr>")).collect();
    let last_error = e
        .last_error
        .as_deref()
        .map(|err| format!(r#"<h2>Last error</h2><pre class="error" id="last-error">{}</pre>"#, esc(err)))
        .unwrap_or_default();
    let attributes = if let Some(what) = &e.unreadable {
        format!(
            r#"<p class="error" id="unreadable">Unreadable in the stored row: {}. The claim parks this entry instead of delivering it.</p>"#,
            esc(what)
        )
    } else if e.attributes.is_empty() {
        r#"<p class="muted">none</p>"#.to_string()
    } else {
        let rows: String = e
            .attributes
            .iter()
            .map(|(k, v)| format!("<tr><th><code>{}</code></th><td><code>{}</code></td></tr>", esc(k), esc(v)))
            .collect();
        format!(r#"<table class="facts">{rows}</table>"#)
    };
    let payloads = match &view.raw_data {
        Payload::Withheld(why) => format!(r#"<p class="muted">Payloads withheld: {}</p>"#, esc(why)),
        _ => {
            let mut p = html::payload_views("Message as received", &e.raw_data);
            if let Some(body) = &e.body {
                p.push_str(&html::payload_views("Decoded event body", body));
            }
            p
        }
    };
    let mut history = String::new();
    for a in view.attempts.as_deref().unwrap_or(&[]) {
        let requests: String = a
            .requests
            .iter()
            .map(|r| {
                let answer = match (r.status, &r.error) {
                    (Some(st), _) => st.to_string(),
                    (None, Some(err)) => format!("error: {err}"),
                    (None, None) => "no answer".into(),
                };
                format!("<div><code>{}. {} {}</code> → {}</div>", r.step, esc(&r.method), esc(&r.path), esc(&answer))
            })
            .collect();
        let _ = write!(
            history,
            r#"<tr class="attempt"><td class="num">{n}</td><td>{started}<div class="muted small">{dur} ms · {owner}</div></td><td>{answer}</td><td>{badge}</td><td class="small">{reason}</td><td class="small">{requests}</td><td><code class="small">{plugin}</code></td></tr>"#,
            n = a.attempt,
            started = esc(&time(a.started_at)),
            dur = a.duration_ms,
            owner = esc(&a.owner),
            answer = esc(&a.answer),
            badge = status_badge(a.status.as_str()),
            reason = esc(a.reason.as_deref().unwrap_or("")),
            plugin = esc(&a.plugin.as_deref().map(|p| cut(p, 12)).unwrap_or_default()),
        );
    }
    let history = if history.is_empty() {
        r#"<p class="muted">No attempt yet.</p>"#.to_string()
    } else {
        format!(
            r#"<table class="attempts"><thead><tr><th class="num">#</th><th>Started</th><th>Answer</th><th>State after</th><th>Reason</th><th>Requests</th><th>Plugin</th></tr></thead><tbody>{history}</tbody></table>"#
        )
    };
    let mut actions = String::new();
    let form = |action: &str, label: &str, reason: bool| {
        let reason = if reason { r#"<input name="reason" placeholder="reason" required>"# } else { "" };
        format!(
            r#"<form method="post" action="/console/entries/{id}/{action}" class="write inline">{csrf}{reason}<button type="submit" class="write">{label}</button></form>"#,
            id = e.id,
            csrf = signed.csrf_field(),
        )
    };
    if matches!(e.status, Status::Parked | Status::Open) && caller.may(Action::Requeue) {
        actions.push_str(&form("requeue", "Requeue", false));
    }
    if e.status == Status::Open && caller.may(Action::Park) {
        actions.push_str(&form("park", "Park", true));
    }
    if e.status == Status::Parked && caller.may(Action::Ignore) {
        actions.push_str(&form("ignore", "Ignore", true));
    }
    let actions = if actions.is_empty() { actions } else { format!(r#"<div class="actions">{actions}</div>"#) };
    let body = format!(
        r#"{actions}<table class="facts">{facts}</table>{last_error}<h2>Attempt history</h2>{history}<h2>Attributes</h2>{attributes}<h2>Payload</h2>{payloads}"#
    );
    signed.page(&format!("Entry {}", e.id), &body)
}

async fn entry_action(
    State(c): State<Arc<Console>>,
    Path((id, action)): Path<(String, String)>,
    posted: Posted,
) -> Response {
    let signed = &posted.signed;
    let Ok(id) = id.parse::<i64>() else {
        return signed.refused(ApiError::new(StatusCode::NOT_FOUND, format!("no entry {id}")));
    };
    let (s, caller) = (c.inbox(), Extension(signed.caller.clone()));
    let reason = || Body(ReasonBody { reason: posted.field("reason").unwrap_or_default() });
    let result = match action.as_str() {
        "requeue" => admin::requeue(State(s), caller, Id(id)).await,
        "park" => admin::park(State(s), caller, Id(id), reason()).await,
        "ignore" => admin::ignore(State(s), caller, Id(id), reason()).await,
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no entry action `{action}`"))),
    };
    match result {
        Ok(Json(done)) => {
            c.sessions.flash(&signed.session, format!("Entry {id}: {} done; it is {} now.", done.action, done.status));
            Redirect::to(&format!("/console/entries/{id}")).into_response()
        }
        Err(e) => signed.refused(e),
    }
}

// ---------------------------------------------------------------------------------------
// Repair by filter
// ---------------------------------------------------------------------------------------

async fn repair(State(c): State<Arc<Console>>, posted: Posted) -> Response {
    let signed = &posted.signed;
    let action = match posted.field("action").as_deref() {
        Some("requeue") => RepairAction::Requeue,
        Some("ignore") => RepairAction::Ignore,
        Some("park") => RepairAction::Park,
        other => {
            return signed.refused(ApiError::bad_request(format!("unknown repair action {:?}", other.unwrap_or(""))));
        }
    };
    let rate = match posted.field("rate").map(|r| r.parse::<u32>()).transpose() {
        Ok(r) => r,
        Err(_) => return signed.refused(ApiError::bad_request("rate must be a whole number of entries per second")),
    };
    let filter = RepairFilter {
        route: posted.field("route"),
        key: posted.field("key"),
        fingerprint: posted.field("fingerprint"),
        text: posted.field("text"),
        received_after: None,
        received_before: None,
        now: posted.field("now").is_some(),
    };
    let start = posted.field("step").as_deref() == Some("start");
    let request = admin::repairs::RepairRequest {
        action,
        filter: filter.clone(),
        reason: posted.field("reason"),
        rate,
        dry_run: !start,
    };
    let answer = admin::repairs::create(State(c.inbox()), Extension(signed.caller.clone()), Body(request)).await;
    let (code, body) = json_of(answer).await;
    if !code.is_success() {
        return signed.refused(api_error(code, &body));
    }
    if start {
        let job = body["job"].as_i64().unwrap_or_default();
        let count = body["matches"]["count"].as_i64().unwrap_or_default();
        let rate = body["rate"].as_u64().unwrap_or_default();
        c.sessions.flash(
            &signed.session,
            format!("Repair job {job} started: {} of {count} entries at {rate}/s.", action.as_str()),
        );
        return Redirect::to("/console/repairs").into_response();
    }
    let count = body["matches"]["count"].as_i64().unwrap_or_default();
    let distinct = body["matches"]["distinct_keys"].as_u64().unwrap_or_default();
    let keys: String = body["matches"]["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str())
        .map(|k| format!("<li><code>{}</code></li>", esc(k)))
        .collect();
    let mut confirm = String::new();
    confirm.push_str(&signed.csrf_field());
    confirm.push_str(&hidden("step", "start"));
    confirm.push_str(&hidden("action", action.as_str()));
    for (name, value) in
        [("route", &filter.route), ("key", &filter.key), ("fingerprint", &filter.fingerprint), ("text", &filter.text)]
    {
        if let Some(v) = value {
            confirm.push_str(&hidden(name, v));
        }
    }
    if filter.now {
        confirm.push_str(&hidden("now", "1"));
    }
    if let Some(reason) = posted.field("reason") {
        confirm.push_str(&hidden("reason", &reason));
    }
    if let Some(rate) = rate {
        confirm.push_str(&hidden("rate", &rate.to_string()));
    }
    let verb = action.as_str();
    let button = if count > 0 {
        format!(
            r#"<form method="post" action="/console/repairs" class="write">{confirm}<button type="submit" class="write danger" id="confirm">{} {count} entries</button> <a href="/console/failures">Cancel</a></form>"#,
            esc(&capitalise(verb))
        )
    } else {
        r#"<p><a href="/console/failures">Back to the failure groups</a></p>"#.to_string()
    };
    let body = format!(
        r#"<p class="preview">A dry run: nothing has moved. <strong>{verb}</strong> would change <strong id="dry-run-count">{count}</strong> entries of <strong id="dry-run-keys">{distinct}</strong> keys matching <code>{filter}</code>{rate_note}.</p><details{open}><summary>Keys</summary><ul class="keys">{keys}</ul></details>{button}"#,
        verb = esc(verb),
        filter = esc(&filter.describe()),
        rate_note = rate.map(|r| format!(", at {r} entries per second")).unwrap_or_default(),
        open = if distinct <= 20 { " open" } else { "" },
    );
    signed.page("Repair preview", &body)
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

async fn jobs(State(c): State<Arc<Console>>, signed: Signed) -> Response {
    let answer = admin::repairs::list(
        State(c.inbox()),
        Extension(signed.caller.clone()),
        Params(admin::repairs::JobsQuery { limit: Some(50) }),
    )
    .await;
    let (code, body) = json_of(answer).await;
    if !code.is_success() {
        return signed.refused(api_error(code, &body));
    }
    let jobs: Vec<RepairJob> = serde_json::from_value(body["jobs"].clone()).unwrap_or_default();
    let mut rows = String::new();
    for j in &jobs {
        let _ = write!(
            rows,
            r#"<tr class="job" data-state="{state}"><td class="num">{id}</td><td>{action}</td><td><code class="small">{filter}</code></td><td>{badge}</td><td><progress max="{total}" value="{moved}"></progress> <span class="job-moved">{moved}</span> / {total}</td><td class="num">{rate}/s</td><td>{actor}</td><td>{created}</td><td>{finished}</td><td class="small error">{error}</td></tr>"#,
            id = j.id,
            action = esc(j.action.as_str()),
            filter = esc(&j.filter.describe()),
            state = j.state.as_str(),
            badge = status_badge(j.state.as_str()),
            total = j.total.max(j.moved),
            moved = j.moved,
            rate = j.rate,
            actor = esc(&j.actor),
            created = esc(&time(j.created_at)),
            finished = j.finished_at.map(|t| esc(&time(t))).unwrap_or_else(|| "—".into()),
            error = esc(j.error.as_deref().unwrap_or("")),
        );
    }
    let running = jobs.iter().any(|j| j.state == JobState::Running);
    let table = if jobs.is_empty() {
        r#"<p class="muted">No repair jobs yet. Start one from a failure group or an entry list.</p>"#.to_string()
    } else {
        format!(
            r#"<table class="jobs"><thead><tr><th class="num">Job</th><th>Action</th><th>Filter</th><th>State</th><th>Progress</th><th class="num">Rate</th><th>By</th><th>Started</th><th>Finished</th><th>Error</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    };
    let note =
        if running { r#"<p><a href="/console/repairs" id="refresh">Refresh</a> to see the progress.</p>"# } else { "" };
    signed.page("Repair jobs", &format!("{note}{table}"))
}

#[derive(Deserialize)]
struct AuditPageQuery {
    after: Option<String>,
}

async fn audit(State(c): State<Arc<Console>>, signed: Signed, Query(q): Query<AuditPageQuery>) -> Response {
    let after = match given(&q.after).map(|a| a.parse::<i64>()).transpose() {
        Ok(a) => a,
        Err(_) => return signed.refused(ApiError::bad_request("`after` must be an audit line id")),
    };
    let asked = admin::AuditQuery { after, limit: Some(100) };
    let page = match admin::audit_log(State(c.inbox()), Extension(signed.caller.clone()), Params(asked)).await {
        Ok(Json(p)) => p,
        Err(e) => return signed.refused(e),
    };
    let mut rows = String::new();
    for a in &page.audit {
        let _ = write!(
            rows,
            r#"<tr class="audit"><td class="num">{id}</td><td>{at}</td><td>{actor}</td><td>{action}</td><td>{route}</td><td>{subject}</td><td>{outcome}</td><td class="small">{detail}</td></tr>"#,
            id = a.id,
            at = esc(&time(a.at)),
            actor = esc(&a.actor),
            action = esc(&a.action),
            route = esc(a.route.as_deref().unwrap_or("—")),
            subject = esc(&a.subject),
            outcome = status_badge(&a.outcome),
            detail = esc(&cut(a.detail.as_deref().unwrap_or(""), 300)),
        );
    }
    let next = page
        .next_after
        .map(|n| format!(r#"<p><a href="/console/audit?after={n}" id="next-page">Next page</a></p>"#))
        .unwrap_or_default();
    let body = format!(
        r#"<p class="muted">Every repair, pause, resume, purge and reload, through the API, the console or the CLI; oldest first.</p><table class="audit"><thead><tr><th class="num">Id</th><th>At</th><th>Who</th><th>Action</th><th>Route</th><th>Subject</th><th>Outcome</th><th>Detail</th></tr></thead><tbody>{rows}</tbody></table>{next}"#
    );
    signed.page("Audit log", &body)
}
