//! Free TCP ports on 127.0.0.1 for processes that a test starts on a port it chose.
//!
//! A port picked now and bound later by another process can be taken in between. In
//! the kernel's ephemeral range it is taken often: every outgoing connection of every
//! test (database pools, HTTP clients) and every `bind(:0)` draws from that range, and
//! a CI run once failed on an `inlet` that found its `--listen` port held by one. So
//! ports come from below that range, where only a deliberate `bind` can take them, and
//! one test process never hands the same port out twice (its tests run as threads, so
//! two of them picking at once would otherwise race each other).

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Ports this process has handed out: never handed out again, even once released (a
/// killed `inlet` or emulator is restarted on its port).
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The lowest port picked: below it lie the well-known services and the ports people
/// give their own servers.
const LOWEST: u16 = 10_000;

/// A TCP port that was free a moment ago on 127.0.0.1, below the kernel's ephemeral
/// range, and not handed out before by this process. Falls back to a port of the
/// ephemeral range (bind to :0, read, release) where that range leaves no room below.
pub fn free_port() -> u16 {
    let below = ephemeral_low().filter(|low| *low > LOWEST + 2_000);
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1_000 {
        let port = match below {
            Some(low) => fastrand::u16(LOWEST..low),
            None => any_free_port(),
        };
        if !handed.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port);
            return port;
        }
    }
    panic!("no free TCP port on 127.0.0.1 after 1,000 tries");
}

/// The first port of the kernel's ephemeral range, if it can be read.
pub fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

fn any_free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port()
}
