//! Cutting connections: [`TcpProxy`], a proxy a test switches off so that a service
//! goes away for the process under test only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A TCP proxy that can be switched off: a service "goes away" for the process under
/// test (which is pointed at `addr`) while the test still reaches it directly. Off, it
/// closes new connections at once and cuts the open ones.
pub struct TcpProxy {
    /// `127.0.0.1:PORT` to use instead of the upstream.
    pub addr: String,
    up: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` (`HOST:PORT`), switched on.
    pub async fn start(upstream: &str) -> TcpProxy {
        let upstream: Arc<str> = Arc::from(upstream);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let up = Arc::new(AtomicBool::new(true));
        let generation = Arc::new(tokio::sync::watch::channel(0u64).0);
        let (up2, generation2) = (Arc::clone(&up), Arc::clone(&generation));
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused from the client's view
                }
                let mut cut = generation2.subscribe();
                let upstream = Arc::clone(&upstream);
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&*upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        TcpProxy { addr, up, generation, task }
    }

    /// Switches the proxy on or off; off also cuts every open connection.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            self.generation.send_modify(|g| *g += 1);
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
