//! A network between Inlet and its database: [`DelayProxy`] forwards TCP connections
//! to an upstream, each byte held back by a fixed one-way delay in each direction.
//!
//! On this machine PostgreSQL is on loopback, where a round trip costs microseconds,
//! so a change that saves round trips measures as nothing; in a deployment the database
//! is across a network, where each costs a fraction of a millisecond or more. The proxy
//! makes that cost visible beside the same run without it.
//!
//! Plain threads, not tasks: a delay under a millisecond needs a timer finer than
//! tokio's (1 ms). Each direction of a connection has a reader, which stamps what it
//! reads with when it may go on, and a writer, which waits for that moment and writes:
//! the delay adds latency without limiting throughput (reads are not held back).

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct DelayProxy {
    /// `127.0.0.1:PORT`: connect here instead of the upstream.
    pub addr: SocketAddr,
}

impl DelayProxy {
    /// Forwards every connection made to [`DelayProxy::addr`] to `upstream`, `one_way`
    /// later in each direction. Runs until the process exits.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the delay proxy");
        let addr = listener.local_addr().expect("the delay proxy's address");
        std::thread::Builder::new()
            .name("delay-accept".into())
            .spawn(move || {
                for inbound in listener.incoming() {
                    let Ok(inbound) = inbound else { continue };
                    let Ok(outbound) = TcpStream::connect(upstream) else {
                        let _ = inbound.shutdown(Shutdown::Both);
                        continue;
                    };
                    for stream in [&inbound, &outbound] {
                        let _ = stream.set_nodelay(true);
                    }
                    let (a, b) = (inbound.try_clone().expect("clone"), outbound.try_clone().expect("clone"));
                    pipe(inbound, outbound, one_way);
                    pipe(b, a, one_way);
                }
            })
            .expect("start the delay proxy");
        DelayProxy { addr }
    }
}

/// Bytes read from `from` are written to `to` `delay` after they were read; the end of
/// `from` ends `to`'s writing half when it comes through.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>();
    std::thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let chunk = match from.read(&mut buf) {
                    Ok(0) | Err(_) => None,
                    Ok(n) => Some(buf[..n].to_vec()),
                };
                let end = chunk.is_none();
                if tx.send((Instant::now() + delay, chunk)).is_err() || end {
                    return;
                }
            }
        })
        .expect("start a delay reader");
    std::thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let Some(chunk) = chunk else { break };
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
        .expect("start a delay writer");
}
