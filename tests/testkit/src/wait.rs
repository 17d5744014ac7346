//! Waiting: the only way tests wait for something is to poll it with a deadline —
//! [`wait_until`] / [`wait_for`], [`wait_while_progressing`] (a deadline on progress,
//! for work whose pace is not ours), or [`poll_blocking`] where awaiting is
//! impossible — never a fixed sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`wait_for`] poll.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `f` (at once, then every 20 ms) until it returns true; panics naming `what` if
/// that has not happened within `timeout`. The only way tests wait for things.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, timeout, || {
        let fut = f();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Like [`wait_until`], for a condition that yields a value: polls until `f` returns
/// `Some` and returns the value.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Some(value) = f().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
    }
}

/// What a condition polled by [`wait_while_progressing`] found.
pub enum Progress<T> {
    /// Met: the value to return.
    Done(T),
    /// Not yet: how far it has come (a count that only grows while work goes on),
    /// and what to print if it stops moving.
    At(u64, String),
}

/// Like [`wait_for`], for work whose pace is not ours to promise (a shadow that runs
/// at the lowest CPU priority, behind whatever else the machine is doing): polls `f`
/// until it is done, and panics naming `what`, with the last thing `f` said, only
/// when its count has not grown for `stalled` — work that stops, not work that is
/// slow.
pub async fn wait_while_progressing<T, F, Fut>(what: &str, stalled: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Progress<T>>,
{
    let mut best: Option<(u64, tokio::time::Instant)> = None;
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let (at, said) = match f().await {
            Progress::Done(value) => return value,
            Progress::At(at, said) => (at, said),
        };
        let now = tokio::time::Instant::now();
        match best {
            Some((count, since)) if at <= count => {
                if now.duration_since(since) >= stalled {
                    panic!("no progress for {stalled:?} (stuck at {count}) waiting for {what}: {said}");
                }
            }
            _ => best = Some((at, now)),
        }
    }
}

/// The blocking twin of [`wait_for`], for code that cannot await (`Drop`, a kill):
/// polls `f` (at once, then every 20 ms) until it returns `Some`; `None` if that has
/// not happened within `timeout`. Blocks the calling thread.
pub fn poll_blocking<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
