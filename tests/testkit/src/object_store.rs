//! A local object store for the claim-check tests: the object download of Cloud
//! Storage's JSON API as Google documents it (`GET /storage/v1/b/BUCKET/o/OBJECT?alt=media`,
//! the object name one percent-encoded path segment; `404` with a JSON error for a
//! missing object) and delete (`DELETE /storage/v1/b/BUCKET/o/OBJECT`, `204`), plus the
//! plain `GET`/`DELETE /plain/OBJECT` of an `http` store, and an S3-compatible store's
//! path-style `GET`/`DELETE /s3/BUCKET/KEY` (the request's `Authorization` is recorded;
//! the signature itself is checked by `src/claim_check.rs`'s tests against AWS's worked
//! example). No
//! emulator of Cloud Storage is packaged in the registries this project may use, so
//! this one is written to the documented request and answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Default)]
struct Inner {
    /// By (bucket, object name).
    objects: HashMap<(String, String), axum::body::Bytes>,
    /// Every answer waits this long first (a slow store).
    delay: Option<Duration>,
    /// Object downloads asked for, and the `Authorization` headers they carried.
    requests: Vec<(String, Option<String>)>,
}

pub struct ObjectStore {
    addr: std::net::SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: tokio::task::JoinHandle<()>,
}

impl ObjectStore {
    pub async fn start() -> ObjectStore {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let app = axum::Router::new()
            .route("/storage/v1/b/{bucket}/o/{object}", axum::routing::get(gcs_object).delete(gcs_delete))
            .route("/plain/{*object}", axum::routing::get(plain_object).delete(plain_delete))
            .route("/s3/{bucket}/{*object}", axum::routing::get(s3_object).delete(s3_delete))
            .with_state(Arc::clone(&inner));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the object store");
        let addr = listener.local_addr().expect("object store address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("object store server");
        });
        ObjectStore { addr, inner, server }
    }

    /// `http://127.0.0.1:PORT`: the `endpoint` of a `gcs` store.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `endpoint` of an `s3` store (path-style).
    pub fn s3_endpoint(&self) -> String {
        format!("http://{}/s3", self.addr)
    }

    /// The `prefix` of an `http` store.
    pub fn plain_prefix(&self) -> String {
        format!("http://{}/plain/", self.addr)
    }

    /// Stores `bytes` as `object` of `bucket` (an `http` store reads bucket `plain`).
    pub fn put(&self, bucket: &str, object: &str, bytes: Vec<u8>) {
        self.lock().objects.insert((bucket.to_string(), object.to_string()), bytes.into());
    }

    /// Whether `object` of `bucket` is stored.
    pub fn contains(&self, bucket: &str, object: &str) -> bool {
        self.lock().objects.contains_key(&(bucket.to_string(), object.to_string()))
    }

    /// Every answer waits `delay` first.
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// The objects asked for so far (`bucket/object`), with their `Authorization` header.
    pub fn requests(&self) -> Vec<(String, Option<String>)> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("object store lock")
    }
}

impl Drop for ObjectStore {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(serde::Deserialize)]
struct Media {
    alt: Option<String>,
}

async fn gcs_object(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((bucket, object)): Path<(String, String)>,
    Query(media): Query<Media>,
    headers: HeaderMap,
) -> Response {
    if media.alt.as_deref() != Some("media") {
        // Only downloads are served; metadata reads are not what Inlet asks for.
        return (StatusCode::NOT_IMPLEMENTED, "only ?alt=media downloads").into_response();
    }
    answer(&inner, bucket, object, &headers).await
}

async fn plain_object(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(object): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(&inner, "plain".into(), object, &headers).await
}

async fn s3_object(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((bucket, object)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    answer(&inner, bucket, object, &headers).await
}

async fn s3_delete(State(inner): State<Arc<Mutex<Inner>>>, Path((bucket, object)): Path<(String, String)>) -> Response {
    remove(&inner, bucket, object)
}

async fn gcs_delete(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((bucket, object)): Path<(String, String)>,
) -> Response {
    remove(&inner, bucket, object)
}

async fn plain_delete(State(inner): State<Arc<Mutex<Inner>>>, Path(object): Path<String>) -> Response {
    remove(&inner, "plain".into(), object)
}

/// `204` once removed, `404` for an object that is not there (as the JSON API answers).
fn remove(inner: &Mutex<Inner>, bucket: String, object: String) -> Response {
    let removed = inner.lock().expect("object store lock").objects.remove(&(bucket, object));
    if removed.is_some() { StatusCode::NO_CONTENT } else { StatusCode::NOT_FOUND }.into_response()
}

async fn answer(inner: &Mutex<Inner>, bucket: String, object: String, headers: &HeaderMap) -> Response {
    let (delay, found) = {
        let mut inner = inner.lock().expect("object store lock");
        let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        inner.requests.push((format!("{bucket}/{object}"), auth));
        (inner.delay, inner.objects.get(&(bucket.clone(), object.clone())).cloned())
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await; // the slow store the test asked for
    }
    match found {
        Some(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        None => {
            let body = serde_json::json!({
                "error": { "code": 404, "message": format!("No such object: {bucket}/{object}"),
                           "errors": [{ "domain": "global", "reason": "notFound" }] }
            });
            (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
        }
    }
}
