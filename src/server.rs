//! The HTTP listener: an accept loop that serves each connection with hyper's HTTP/1
//! under a header-read timeout, caps the connections it holds, and stops gracefully.
//!
//! `axum::serve` offers no header-read timeout, so a client that opens connections
//! and never finishes its headers (slowloris) would hold them forever. hyper has the
//! timeout but needs a timer; this loop gives it tokio's. Shutdown works as
//! `axum::serve`'s graceful shutdown did: stop accepting, let every connection finish
//! the request it is in (idle keep-alive connections close at once), wait for them.
//!
//! Every listener is bounded: at most `max_connections` open connections, and at most
//! `max_connections_per_peer` from one peer address (an IPv6 peer counts by its /64,
//! which one host usually holds whole). A connection over either cap is answered 503
//! and closed before a byte of it is read. Every endpoint's body must arrive within
//! `request_timeout` and is capped ([`bound_body`]; `/push` has its own
//! `crate::source::push::limit`). Refusals are counted in
//! `inlet_listener_refused_total{listener, reason}`.
//!
//! Draining ([`Drain`]): from a stop signal until the listener closes, every answer
//! says `Connection: close`, so a client holding a keep-alive connection to this
//! instance opens its next one through the load balancer, to an instance that stays.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{LengthLimitError, Limited};
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::telemetry::{ListenerLabel, Metrics};

/// Whether the process is draining: told to stop, still serving until its drain
/// delay is over. Shared by the listeners (which close connections after each
/// answer) and `/readyz` (which answers 503 `draining`).
#[derive(Debug, Clone, Default)]
pub struct Drain(Arc<AtomicBool>);

impl Drain {
    /// Starts draining; false if it had started already.
    pub fn start(&self) -> bool {
        !self.0.swap(true, Ordering::SeqCst)
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Middleware in front of every endpoint: while draining, each answer closes its
/// connection (hyper ends a connection after an answer saying `Connection: close`).
/// A load balancer routes only new connections away from an instance that is no
/// longer ready; without this, a client's pooled connection would keep its requests
/// coming here until the listener closes under them.
pub async fn close_while_draining(State(drain): State<Drain>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if drain.is_draining() {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Pause after an accept error that is not about one connection (say, too many open
/// files), so the loop does not spin while the process is out of descriptors.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(500);

/// How one listener is bounded.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// The listener's name in metrics and logs: `server` or `admin`.
    pub name: &'static str,
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
}

/// Logs about refused connections at most this often (a flood would fill the log);
/// the metric counts every one.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The answer to a connection over a cap (`reason`), written without reading the
/// request.
fn over_cap(reason: &str) -> Vec<u8> {
    let body = format!(r#"{{"error":"too many open connections ({reason}); retry later","reason":"{reason}"}}"#);
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The address a per-peer cap counts by: an IPv4 address (also when mapped into
/// IPv6), or an IPv6 address's /64.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

/// Serves `app` on `listener` until `shutdown` turns true, then waits for the open
/// connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    bounds: Bounds,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(bounds.header_read_timeout);
    metrics.register_listener(bounds.name);
    let mut connections = JoinSet::new();
    let mut open = Open {
        gauge: metrics.listener_connections.get_or_create(&ListenerLabel { listener: bounds.name }).clone(),
        ..Open::default()
    };
    let mut refused_since_log = 0u64;
    let mut last_log: Option<Instant> = None;
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Connections that ended since the last reap no longer count.
                    while let Some(done) = connections.try_join_next_with_id() {
                        open.release(&done);
                    }
                    let key = peer_key(peer.ip());
                    let refusal = if connections.len() >= bounds.max_connections {
                        Some("max_connections")
                    } else if open.from(key) >= bounds.max_connections_per_peer {
                        Some("max_connections_per_peer")
                    } else {
                        None
                    };
                    if let Some(reason) = refusal {
                        metrics.listener_refused(bounds.name, reason);
                        refused_since_log += 1;
                        if last_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
                            tracing::warn!(
                                listener = bounds.name,
                                %peer,
                                reason,
                                refused = refused_since_log,
                                "refused connections over a cap (503); `refused` counts them since the last such line"
                            );
                            refused_since_log = 0;
                            last_log = Some(Instant::now());
                        }
                        // Best effort, never waiting: the socket's send buffer is empty.
                        let _ = stream.try_write(&over_cap(reason));
                        continue;
                    }
                    // The peer address, as `axum::extract::ConnectInfo` (the admin gate's
                    // loopback check reads it).
                    let app = app.clone().layer(axum::Extension(axum::extract::ConnectInfo(peer)));
                    let handle = connections.spawn(connection(http.clone(), stream, app, shutdown.clone()));
                    open.add(handle.id(), key);
                }
                Err(error) => accept_failed(error).await,
            },
            // Reap finished connections so the set holds only open ones.
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => open.release(&done),
            _ = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    tracing::debug!(open = connections.len(), "listener closed; waiting for open connections");
    while let Some(done) = connections.join_next_with_id().await {
        open.release(&done);
    }
}

/// A listener's open connections: how many per peer key, and whose each task is.
#[derive(Default)]
struct Open {
    per_peer: HashMap<IpAddr, usize>,
    peer_of: HashMap<tokio::task::Id, IpAddr>,
    /// `inlet_listener_connections` of this listener.
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Open {
    fn from(&self, key: IpAddr) -> usize {
        self.per_peer.get(&key).copied().unwrap_or(0)
    }

    fn add(&mut self, task: tokio::task::Id, key: IpAddr) {
        self.peer_of.insert(task, key);
        *self.per_peer.entry(key).or_default() += 1;
        self.gauge.inc();
    }

    /// A connection task ended (or panicked: its connection is closed all the same).
    fn release(&mut self, done: &Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        let task = match done {
            Ok((id, ())) => *id,
            Err(e) => e.id(),
        };
        let Some(key) = self.peer_of.remove(&task) else { return };
        self.gauge.dec();
        if let Some(n) = self.per_peer.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&key);
            }
        }
    }
}

/// One connection: requests until the client closes, a timeout cuts it, or shutdown
/// asks it to finish the request in hand and close.
async fn connection(http: http1::Builder, stream: TcpStream, app: Router, mut shutdown: watch::Receiver<bool>) {
    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        // A header-read timeout, a client that went away, a malformed request.
        tracing::debug!(%error, "http connection ended with an error");
    }
}

/// Resolves once shutdown is asked for (or nobody can ask any more).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn accept_failed(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(error.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return; // that connection is gone; the listener is fine
    }
    tracing::error!(%error, "cannot accept connections; trying again shortly");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

// ---------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------

/// Largest body an endpoint other than `/push` reads (the admin API's and the
/// console's forms; axum's own extractor limit is the same).
pub const MAX_BODY: usize = 2 << 20;

/// The state of [`bound_body`].
#[derive(Clone)]
pub struct BodyBounds {
    pub listener: &'static str,
    pub metrics: Arc<Metrics>,
    /// Time from the request's headers to the last byte of its body.
    pub timeout: Duration,
}

/// What became of a bounded body, written by [`Bounded`] and read by [`bound_body`].
const BODY_OK: u8 = 0;
const BODY_LATE: u8 = 1;
const BODY_TOO_LARGE: u8 = 2;

/// Middleware in front of every endpoint but `/push` (which has its own): the body,
/// whenever a handler reads it, must arrive within `timeout` of the headers (408) and
/// hold at most [`MAX_BODY`] bytes (413). Nothing is read here, so an endpoint that
/// refuses before reading (the admin API's 401) still never reads a stranger's body.
pub async fn bound_body(State(bounds): State<BodyBounds>, request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/push/") {
        return next.run(request).await;
    }
    let refuse = |reason: &'static str, code: StatusCode, error: String| {
        bounds.metrics.listener_refused(bounds.listener, reason);
        tracing::warn!(listener = bounds.listener, reason, "refused a request: {error}");
        let mut r = (code, axum::Json(serde_json::json!({ "error": error, "reason": reason }))).into_response();
        // The rest of the body is not read: the connection cannot carry another request.
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    let too_large = || format!("the body is larger than {MAX_BODY} bytes");
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return refuse("too_large", StatusCode::PAYLOAD_TOO_LARGE, too_large());
    }
    let path = request.uri().path().to_string();
    let fate = Arc::new(AtomicU8::new(BODY_OK));
    let (parts, body) = request.into_parts();
    let bounded = Bounded {
        inner: Limited::new(body, MAX_BODY),
        deadline: Box::pin(tokio::time::sleep(bounds.timeout)),
        fate: Arc::clone(&fate),
    };
    let response = next.run(Request::from_parts(parts, Body::new(bounded))).await;
    match fate.load(Ordering::Acquire) {
        BODY_LATE => {
            let error = format!(
                "the body of {path} did not arrive within request_timeout ({})",
                humantime::format_duration(bounds.timeout)
            );
            refuse("body_timeout", StatusCode::REQUEST_TIMEOUT, error)
        }
        BODY_TOO_LARGE => refuse("too_large", StatusCode::PAYLOAD_TOO_LARGE, too_large()),
        _ => response,
    }
}

/// A request body that ends in an error once its deadline passes or it grows past
/// its limit, and says which in `fate`.
struct Bounded {
    inner: Limited<Body>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    fate: Arc<AtomicU8>,
}

/// The error a [`Bounded`] body ends with when its deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyDeadline;

impl HttpBody for Bounded {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                if e.is::<LengthLimitError>() {
                    this.fate.store(BODY_TOO_LARGE, Ordering::Release);
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.fate.store(BODY_LATE, Ordering::Release);
                    return Poll::Ready(Some(Err(Box::new(BodyDeadline))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_counted_by_address_and_ipv6_by_its_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(peer_key(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(peer_key(ip("2001:db8:1:2:bbbb::9")), peer_key(ip("2001:db8:1:2:aaaa::1")));
        assert_ne!(peer_key(ip("2001:db8:1:3::1")), peer_key(ip("2001:db8:1:2::1")));
    }
}
