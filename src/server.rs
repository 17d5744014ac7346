//! The HTTP listener: an accept loop that serves each connection with hyper's HTTP/1
//! under a header-read timeout, and stops gracefully.
//!
//! `axum::serve` offers no header-read timeout, so a client that opens connections
//! and never finishes its headers (slowloris) would hold them forever. hyper has the
//! timeout but needs a timer; this loop gives it tokio's. Shutdown works as
//! `axum::serve`'s graceful shutdown did: stop accepting, let every connection finish
//! the request it is in (idle keep-alive connections close at once), wait for them.

use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Pause after an accept error that is not about one connection (say, too many open
/// files), so the loop does not spin while the process is out of descriptors.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(500);

/// Serves `app` on `listener` until `shutdown` turns true, then waits for the open
/// connections to finish their requests.
pub async fn serve(listener: TcpListener, app: Router, header_read_timeout: Duration, shutdown: watch::Receiver<bool>) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // The peer address, as `axum::extract::ConnectInfo` (the admin gate's
                    // loopback check reads it).
                    let app = app.clone().layer(axum::Extension(axum::extract::ConnectInfo(peer)));
                    connections.spawn(connection(http.clone(), stream, app, shutdown.clone()));
                }
                Err(error) => accept_failed(error).await,
            },
            // Reap finished connections so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    tracing::debug!(open = connections.len(), "listener closed; waiting for open connections");
    while connections.join_next().await.is_some() {}
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
