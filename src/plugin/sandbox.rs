//! What a plugin instance sees of the world, and what it may take from the host:
//! frozen clocks, a random stream that restarts at every call, a stderr that keeps
//! only the current call's first bytes, and memory counted per instance (over all
//! its memories and tables) and against one process-wide budget.
//!
//! Time and randomness are deterministic on purpose: decoding the same message again
//! (a redelivery, a requeue) must give the same answer, and a plugin has no business
//! with the host's clock. A plugin that wants time reads the message's publish time.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

/// The wall clock a plugin reads: always the Unix epoch.
pub(super) struct FrozenWallClock;

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The monotonic clock a plugin reads: always zero. A sleep still waits (on the
/// host's timer), and the call's wall-clock backstop bounds it.
pub(super) struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The seed every call's random stream starts from.
const SEED: u64 = 0x1a1e_7000_5eed_0001;

/// A random stream (SplitMix64) that the host rewinds before every call, shared by
/// the instance's `random` and `insecure-random` interfaces.
#[derive(Clone)]
pub(super) struct CallRandom(Arc<AtomicU64>);

impl CallRandom {
    pub(super) fn new() -> CallRandom {
        CallRandom(Arc::new(AtomicU64::new(SEED)))
    }

    pub(super) fn rewind(&self) {
        self.0.store(SEED, Ordering::Relaxed);
    }

    fn next(&self) -> u64 {
        let mut z = self.0.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for CallRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.next() >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }
}

/// The guest's stderr: the first `capacity` bytes written during the current call.
/// Writes never fail (a full buffer drops the rest and remembers that it did), so a
/// chatty plugin keeps working; the host clears it before every call, so a fault
/// shows only the stderr of the call that failed.
#[derive(Clone)]
pub(super) struct StderrCapture {
    capacity: usize,
    inner: Arc<Mutex<Captured>>,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

impl StderrCapture {
    pub(super) fn new(capacity: usize) -> StderrCapture {
        StderrCapture { capacity, inner: Arc::new(Mutex::new(Captured::default())) }
    }

    pub(super) fn clear(&self) {
        let mut c = self.inner.lock().expect("stderr lock");
        c.bytes.clear();
        c.dropped = 0;
    }

    /// The current call's stderr as text, with a note when some of it was dropped.
    pub(super) fn text(&self) -> String {
        let c = self.inner.lock().expect("stderr lock");
        let mut text = String::from_utf8_lossy(&c.bytes).into_owned();
        if c.dropped > 0 {
            text.push_str(&format!(" […{} more bytes dropped]", c.dropped));
        }
        text
    }

    fn keep(&self, buf: &[u8]) {
        let mut c = self.inner.lock().expect("stderr lock");
        let room = self.capacity.saturating_sub(c.bytes.len());
        let kept = room.min(buf.len());
        c.bytes.extend_from_slice(&buf[..kept]);
        c.dropped += buf.len() - kept;
    }
}

impl IsTerminal for StderrCapture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrCapture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrCapture {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.keep(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        // Always room: what does not fit is dropped, not refused.
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrCapture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for StderrCapture {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Plugin memory of the whole process: every instance's memories and tables, live
/// or pooled, counted against one budget (`[server] plugin_memory_mib`).
pub struct MemoryBudget {
    limit: AtomicUsize,
    used: AtomicUsize,
    /// Bytes ever taken plus bytes ever given back: what instances made the process
    /// map and unmap, which costs every thread of the process, not only the caller.
    churned: AtomicU64,
}

/// The process's plugin memory budget.
pub static BUDGET: MemoryBudget = MemoryBudget::unlimited();

/// The budget of shadow candidates (`crate::shadow`), apart from [`BUDGET`]: a
/// candidate that hoards memory runs out of its own, never the serving plugins'.
pub static SHADOW_BUDGET: MemoryBudget = MemoryBudget::unlimited();

impl MemoryBudget {
    const fn unlimited() -> MemoryBudget {
        MemoryBudget { limit: AtomicUsize::new(usize::MAX), used: AtomicUsize::new(0), churned: AtomicU64::new(0) }
    }

    /// Sets the limit; instances already over it keep what they have.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes held by plugin instances now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes taken and given back since the process started, growing only.
    pub fn churned(&self) -> u64 {
        self.churned.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok();
        if taken {
            self.churned.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        taken
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.churned.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Bytes one table element is counted as.
const TABLE_ELEMENT_BYTES: usize = 16;

/// Which limit stopped a growth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LimitHit {
    /// The instance's own cap: the plugin's fault.
    Instance,
    /// The process budget: the host is full, not the plugin's fault.
    Process,
}

/// Caps one instance's memories and tables together and charges the process budget;
/// remembers which limit a failed growth hit, so the fault can say so.
pub(super) struct Limiter {
    cap: usize,
    used: usize,
    pub(super) hit: Option<LimitHit>,
    budget: &'static MemoryBudget,
}

impl Limiter {
    #[cfg(test)]
    pub(super) fn new(cap: usize) -> Limiter {
        Limiter::charging(cap, &BUDGET)
    }

    pub(super) fn charging(cap: usize, budget: &'static MemoryBudget) -> Limiter {
        Limiter { cap, used: 0, hit: None, budget }
    }

    /// Bytes this instance holds (all memories and tables).
    pub(super) fn used(&self) -> usize {
        self.used
    }

    fn grow(&mut self, bytes: usize) -> wasmtime::Result<bool> {
        if self.used.saturating_add(bytes) > self.cap {
            self.hit = Some(LimitHit::Instance);
            return Err(wasmtime::Error::msg(format!("instance memory limit of {} bytes reached", self.cap)));
        }
        if !self.budget.try_take(bytes) {
            self.hit = Some(LimitHit::Process);
            return Err(wasmtime::Error::msg("the host's plugin memory budget is used up"));
        }
        self.used += bytes;
        Ok(true)
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.budget.give_back(self.used);
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.grow(desired.saturating_sub(current))
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.grow(desired.saturating_sub(current).saturating_mul(TABLE_ELEMENT_BYTES))
    }

    fn memories(&self) -> usize {
        // wasmtime's default; the byte cap above is what bounds them together.
        10_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component whose core module has two memories and grows both: each growth
    /// alone fits a per-memory cap, together they exceed the instance's cap.
    const TWO_MEMORIES: &str = r#"
        (component
          (core module $m
            (memory $a 1)
            (memory $b 1)
            (func (export "grow") (param i32) (result i32)
              (drop (memory.grow $a (local.get 0)))
              (memory.grow $b (local.get 0))))
          (core instance $i (instantiate $m))
          (func (export "grow") (param "pages" u32) (result s32)
            (canon lift (core func $i "grow"))))
    "#;

    #[test]
    fn the_instance_cap_covers_all_memories_together() {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        let engine = wasmtime::Engine::new(&config).unwrap();
        let bytes = wat::parse_str(TWO_MEMORIES).expect("valid component text");
        let component = wasmtime::component::Component::new(&engine, bytes).expect("compiles");
        let linker = wasmtime::component::Linker::<Limiter>::new(&engine);
        // 4 MiB for the instance: two memories of 1 page, each grown by 40 pages
        // (2.6 MiB each, 5.1 MiB together).
        let mut store = wasmtime::Store::new(&engine, Limiter::new(4 << 20));
        store.limiter(|l| l);
        let instance = linker.instantiate(&mut store, &component).expect("instantiates within the cap");
        assert_eq!(store.data().used(), 2 * 65536, "both initial memories are counted");
        let grow = instance.get_typed_func::<(u32,), (i32,)>(&mut store, "grow").unwrap();
        let failed = grow.call(&mut store, (40,)).expect_err("the second memory's growth passes the instance cap");
        assert_eq!(store.data().hit, Some(LimitHit::Instance), "{failed:#}");
        assert_eq!(store.data().used(), 41 * 65536 + 65536, "the first growth counted, the refused one not");
    }

    #[test]
    fn the_process_budget_refuses_growth_past_it_and_gets_memory_back() {
        static LOCAL: MemoryBudget =
            MemoryBudget { limit: AtomicUsize::new(8192), used: AtomicUsize::new(0), churned: AtomicU64::new(0) };
        {
            let mut one = Limiter::charging(1 << 20, &LOCAL);
            assert!(one.grow(4096).unwrap());
            let mut two = Limiter::charging(1 << 20, &LOCAL);
            assert!(two.grow(8192).is_err(), "4096 + 8192 is past the budget of 8192");
            assert_eq!(two.hit, Some(LimitHit::Process), "the host's budget, not the plugin's cap");
            assert_eq!(LOCAL.used(), 4096);
        }
        assert_eq!(LOCAL.used(), 0, "dropped instances give their memory back");
        assert_eq!(LOCAL.churned(), 2 * 4096, "the taking and the giving back are churn, the refusal is not");
    }

    #[test]
    fn stderr_keeps_the_first_bytes_of_a_call_and_never_refuses_a_write() {
        let mut s = StderrCapture::new(8);
        OutputStream::write(&mut s, bytes::Bytes::from_static(b"0123456789")).unwrap();
        assert_eq!(s.text(), "01234567 […2 more bytes dropped]");
        assert!(s.check_write().unwrap() > 0);
        s.clear();
        assert_eq!(s.text(), "");
    }

    #[test]
    fn the_random_stream_restarts_when_rewound() {
        use rand_core::TryRng;
        let mut r = CallRandom::new();
        let first = (r.try_next_u64().unwrap(), r.try_next_u64().unwrap());
        r.rewind();
        assert_eq!(first, (r.try_next_u64().unwrap(), r.try_next_u64().unwrap()));
        assert_ne!(first.0, first.1);
    }
}
