//! Wrong tokens are guesses: [`Guesses`] counts unknown tokens per peer (an IPv6
//! peer by its /64), and after a few free ones makes the peer wait, doubling the wait
//! with each further failure, before any token of its is looked at again. The admin
//! API's bearer tokens and the console's sign-in share one table, since both guess
//! the same secrets.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::server::peer_key;
use crate::telemetry::{Metrics, SignInLabels};

/// Unknown tokens a peer may present before it has to wait.
pub const FREE_FAILURES: u32 = 5;
/// The first wait; each further failure doubles it.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// A peer's failures are forgotten this long after its last one.
const FORGET_AFTER: Duration = Duration::from_secs(900);
/// Peers tracked at most; beyond, new peers are not tracked (logged) until old ones
/// are forgotten, so the table cannot grow without bound.
const MAX_PEERS: usize = 65_536;

/// One peer's unknown tokens.
struct Strikes {
    failures: u32,
    last: Instant,
    /// No token of this peer is looked at before then.
    until: Instant,
}

/// Unknown tokens by peer (an IPv6 peer by its /64): the console's sign-in and the
/// admin API's bearer tokens share it, since both guess the same secrets.
#[derive(Default)]
pub struct Guesses {
    peers: Mutex<HashMap<IpAddr, Strikes>>,
}

/// What [`Guesses::check`] found.
pub enum Checked<T> {
    Found(T),
    Unknown,
    /// The peer has to wait this many seconds; its token was not looked at.
    Wait(u64),
}

impl Guesses {
    /// Looks a token up with `find` unless `peer` has to wait, and counts an unknown
    /// token as a failure. A known token does not forget the peer's failures: a holder
    /// of one token would otherwise mix it into its guesses at another. Counts refusals
    /// in `inlet_sign_in_refused_total{via}` and logs the failure that starts or
    /// lengthens a wait.
    pub fn check<T>(
        &self,
        metrics: &Metrics,
        via: &'static str,
        peer: Option<SocketAddr>,
        find: impl FnOnce() -> Option<T>,
    ) -> Checked<T> {
        let key = peer.map(|p| peer_key(p.ip()));
        let count = |reason| metrics.sign_in_refused.get_or_create(&SignInLabels { via, reason }).inc();
        if let Some(wait) = key.and_then(|k| self.wait(k)) {
            count("rate_limited");
            tracing::debug!(via, peer = ?peer, wait_secs = wait, "token refused unread: the peer is waiting out its failures");
            return Checked::Wait(wait);
        }
        match find() {
            Some(caller) => Checked::Found(caller),
            None => {
                count("unknown_token");
                let (failures, wait) = key.map_or((0, None), |k| self.failed(k));
                match wait {
                    Some(wait) => tracing::warn!(
                        via,
                        peer = ?peer,
                        failures,
                        wait_secs = wait.as_secs(),
                        "unknown token; this peer now waits before its next token is looked at (429)"
                    ),
                    None => tracing::warn!(via, peer = ?peer, failures, "unknown token"),
                }
                Checked::Unknown
            }
        }
    }

    /// Seconds (rounded up) `peer` must still wait, if it must.
    fn wait(&self, key: IpAddr) -> Option<u64> {
        let peers = self.peers.lock().expect("guesses lock");
        let left = peers.get(&key)?.until.checked_duration_since(Instant::now())?;
        Some(left.as_secs() + u64::from(left.subsec_nanos() > 0)).filter(|&s| s > 0)
    }

    /// Records a failure: the peer's failure count and the wait it starts, if any.
    fn failed(&self, key: IpAddr) -> (u32, Option<Duration>) {
        let now = Instant::now();
        let mut peers = self.peers.lock().expect("guesses lock");
        if !peers.contains_key(&key) && peers.len() >= MAX_PEERS {
            peers.retain(|_, s| now.duration_since(s.last) < FORGET_AFTER);
            if peers.len() >= MAX_PEERS {
                tracing::warn!(peer = %key, "too many peers with unknown tokens to track another; not counted");
                return (1, None);
            }
        }
        let strikes = peers.entry(key).or_insert(Strikes { failures: 0, last: now, until: now });
        if now.duration_since(strikes.last) >= FORGET_AFTER {
            strikes.failures = 0;
        }
        strikes.failures += 1;
        strikes.last = now;
        let over = strikes.failures.saturating_sub(FREE_FAILURES);
        if over == 0 {
            return (strikes.failures, None);
        }
        let wait = FIRST_WAIT.saturating_mul(1u32 << (over - 1).min(20)).min(MAX_WAIT);
        strikes.until = now + wait;
        (strikes.failures, Some(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_tokens_make_a_peer_wait_longer_each_time_up_to_the_cap() {
        let guesses = Guesses::default();
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        for i in 1..=FREE_FAILURES {
            assert_eq!(guesses.failed(peer), (i, None), "failure {i} is free");
            assert_eq!(guesses.wait(peer), None);
        }
        let waits: Vec<Duration> = (0..12).map(|_| guesses.failed(peer).1.unwrap()).collect();
        assert_eq!(waits[0], FIRST_WAIT);
        assert_eq!(waits[1], FIRST_WAIT * 2);
        assert_eq!(waits[4], FIRST_WAIT * 16);
        assert_eq!(*waits.last().unwrap(), MAX_WAIT);
        assert!(guesses.wait(peer).is_some_and(|s| s >= MAX_WAIT.as_secs() - 1));
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        assert_eq!(guesses.wait(other), None, "another peer does not wait");
    }
}
