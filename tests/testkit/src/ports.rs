//! Free TCP ports on 127.0.0.1.

/// A TCP port that was free a moment ago on 127.0.0.1 (bind to :0, read, release).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port()
}

/// A TCP port that was free a moment ago on 127.0.0.1 and lies below the kernel's
/// ephemeral range, for a service that is restarted on the same port (an emulator, a
/// PostgreSQL cluster, a killed `inlet`): while it is down, no client connection can
/// be given that port as its own and keep it from listening again. Falls back to
/// [`free_port`] if no such port binds.
pub fn free_restartable_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        for _ in 0..100 {
            let port = fastrand::u16(10_000..low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    free_port()
}
