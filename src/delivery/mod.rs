//! Targets: where the relay delivers a rendered request. The plugin shapes the
//! request; the host adds the base URL, static headers, the idempotency key and the
//! timeout, and turns whatever happened into an [`wit::Outcome`] for `classify`.

pub mod publish;

use std::time::Duration;

use crate::config::TargetConfig;
use crate::plugin::wit;
use crate::pubsub_client::Connection;

/// Bytes of a response body kept for `classify`.
const MAX_RESPONSE_BYTES: usize = 256 * 1024;

pub enum Target {
    Http(HttpTarget),
    Pubsub(publish::PubsubTarget),
    Log { route: String },
}

pub struct HttpTarget {
    client: reqwest::Client,
    base: String,
    /// `scheme://host:port` of `base`: all a transport error says of the URL.
    origin: String,
    timeout: Duration,
    headers: Vec<(String, String)>,
}

/// The clients a process shares among its targets.
#[derive(Clone)]
pub struct Clients {
    /// Keep-alive pooled HTTP client for every http target.
    pub http: reqwest::Client,
    /// Where Pub/Sub targets publish.
    pub pubsub: Connection,
}

/// Idle keep-alive connections kept per target host (across every route using it).
const POOL_MAX_IDLE_PER_HOST: usize = 1024;

impl Clients {
    pub fn new(pubsub: Connection) -> Clients {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(60))
            // Keep as many connections warm as a busy route has requests in flight: a
            // smaller cap closed the surplus after every wave of attempts and opened it
            // again for the next (route concurrency 256: a new TCP connection per few
            // deliveries, a third of the relay's CPU in the kernel).
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .tcp_nodelay(true)
            // A target's 3xx is its answer, for `classify`: following it would send the
            // method, body, idempotency key and the route's secret headers to wherever
            // `Location` points (any host Inlet can reach), and store that host's answer
            // in `last_error` for the team to read.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the HTTP client configuration is valid");
        Clients { http, pubsub }
    }
}

/// What a target may use of the entry besides the rendered request.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// Stable for every attempt at one entry: the dedup key.
    pub idempotency_key: &'a str,
    pub correlation_key: &'a str,
}

impl Target {
    pub fn new(route: &str, config: &TargetConfig, clients: &Clients) -> Target {
        match config {
            TargetConfig::Log => Target::Log { route: route.to_string() },
            TargetConfig::Http(h) => Target::Http(HttpTarget {
                client: clients.http.clone(),
                base: h.url.clone(),
                origin: crate::redact::origin(&h.url),
                timeout: h.timeout,
                headers: h.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            }),
            TargetConfig::Pubsub(p) => Target::Pubsub(publish::PubsubTarget::new(p.clone(), clients.pubsub.clone())),
        }
    }

    pub async fn deliver(&self, req: &wit::Request, delivery: &Delivery<'_>) -> wit::Outcome {
        match self {
            Target::Log { route } => {
                tracing::info!(
                    route = %route,
                    method = %req.method,
                    path = %req.path,
                    idempotency_key = delivery.idempotency_key,
                    body = %String::from_utf8_lossy(&req.body),
                    "log target received a delivery"
                );
                wit::Outcome::Response(wit::Response { status: 204, headers: vec![], body: vec![] })
            }
            Target::Http(h) => h.deliver(req, delivery.idempotency_key).await,
            Target::Pubsub(p) => p.deliver(req, delivery).await,
        }
    }
}

impl HttpTarget {
    async fn deliver(&self, req: &wit::Request, idempotency_key: &str) -> wit::Outcome {
        let method = match reqwest::Method::from_bytes(req.method.as_bytes()) {
            Ok(m) => m,
            Err(_) => {
                return transport(
                    wit::TransportErrorKind::Other,
                    format!("plugin rendered an invalid method `{}`", req.method),
                );
            }
        };
        let path =
            if req.path.starts_with('/') || req.path.is_empty() { req.path.clone() } else { format!("/{}", req.path) };
        let mut builder = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .timeout(self.timeout)
            .header("idempotency-key", idempotency_key)
            .body(req.body.clone());
        for (k, v) in self.headers.iter().chain(req.headers.iter()) {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let mut response = match builder.send().await {
            Ok(r) => r,
            Err(e) => return transport_error(e, &self.origin),
        };
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_RESPONSE_BYTES - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if body.len() >= MAX_RESPONSE_BYTES {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return transport_error(e, &self.origin),
            }
        }
        wit::Outcome::Response(wit::Response { status, headers, body })
    }
}

pub(crate) fn transport(kind: wit::TransportErrorKind, message: String) -> wit::Outcome {
    wit::Outcome::TransportError(wit::TransportError { kind, message })
}

/// A transport error as stored in `last_error`: the target named by its origin only.
/// reqwest names the full URL, whose path may itself be a credential (a webhook's
/// `/hooks/T000/B000/SECRET`), as may its query or userinfo.
fn transport_error(e: reqwest::Error, origin: &str) -> wit::Outcome {
    let kind = if e.is_timeout() {
        wit::TransportErrorKind::Timeout
    } else if e.is_connect() {
        wit::TransportErrorKind::Connect
    } else {
        wit::TransportErrorKind::Other
    };
    let e = e.without_url();
    // The error's source chain says why (refused, reset, …); keep all of it.
    let mut message = format!("{origin}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    // No source is known to quote the URL; should one, its query and userinfo go.
    transport(kind, crate::redact::text(&message))
}

/// A one-line description of an outcome for `last_error`.
pub fn describe(outcome: &wit::Outcome) -> String {
    match outcome {
        wit::Outcome::Response(r) => {
            let body = String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned();
            if body.is_empty() {
                format!("target answered {}", r.status)
            } else {
                format!("target answered {}: {body}", r.status)
            }
        }
        wit::Outcome::TransportError(t) => {
            let kind = match t.kind {
                wit::TransportErrorKind::Timeout => "timeout",
                wit::TransportErrorKind::Connect => "connect",
                wit::TransportErrorKind::Other => "transport",
            };
            format!("{kind} error reaching the target: {}", t.message)
        }
    }
}
