//! `GET /api/openapi.json`: the OpenAPI 3.1 description of Inlet's HTTP API, written by
//! hand in `openapi.json` beside this file and served as it is. `tests/api.rs` checks
//! that it names every path and method `src/app.rs` routes, and nothing else.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The description, as committed.
pub const OPENAPI: &str = include_str!("openapi.json");

pub async fn serve() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
