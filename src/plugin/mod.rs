//! The plugin host: loads WebAssembly components that implement the `inlet:plugin`
//! world and calls them inside a sandbox.
//!
//! One [`wasmtime::Engine`] for the process; per plugin a pre-instantiated
//! component (`RouterPre`, type-checked at load) and a small pool of warm instances.
//!
//! Calls are async (wasmtime fibers on tokio's workers), which is what bounds them
//! whatever the plugin does:
//! - an instruction budget (fuel) is the verdict on a plugin that is too slow: it
//!   does not depend on how busy the host is, so the same message gets the same
//!   answer on a quiet and on a loaded machine;
//! - a wall-clock backstop (`call_timeout`) abandons a call that waits — a plugin
//!   sleeping in a WASI poll uses no fuel — by dropping its future. The guest yields
//!   to tokio at every epoch tick, so even a computing guest is abandoned in time.
//!   Hitting the backstop says "the host was slow or the plugin waited", so callers
//!   treat it as transient ([`PluginFault::is_transient`]);
//! - at most `max_concurrent_calls` calls of one plugin run at once; a call that
//!   finds no slot within the backstop is turned away as busy.
//!
//! An instance that trapped, hit a limit or was abandoned is discarded; a healthy one
//! is reused for up to [`MAX_USES`] calls while it stays under `keep_warm_mib`,
//! because instantiating per call costs about five times a warm call.
//!
//! Plugins get WASI only because language runtimes import it: no preopened
//! directories, no environment, no sockets, frozen clocks and a random stream that
//! restarts at every call (see [`sandbox`]); stderr keeps the current call's first
//! [`STDERR_CAPACITY`] bytes, which explain a panic.

mod bindings;
pub mod load;
pub mod resident;
pub mod sandbox;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use bindings::types as wit;
use bindings::{Router, RouterPre};
use sandbox::{CallRandom, FrozenMonotonicClock, FrozenWallClock, LimitHit, Limiter, StderrCapture};

use crate::config::PluginLimits;

/// Calls a warm instance serves before it is replaced.
pub const MAX_USES: u32 = 10_000;
/// Warm instances kept per plugin.
const POOL_SIZE: usize = 16;
/// Epoch tick: how often a running guest yields to tokio.
const TICK: Duration = Duration::from_millis(5);
/// Bytes of guest stderr kept per call (the start of a panic message).
pub const STDERR_CAPACITY: usize = 16 * 1024;

/// A failure during a plugin call. Most are the plugin's fault: the entry is parked
/// (decode, render) or the attempt counts as failed (classify). The transient ones
/// ([`PluginFault::is_transient`]) say the host could not run the call now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginFault {
    #[error("plugin call did not finish within its wall-clock backstop of {0:?}")]
    Timeout(Duration),
    #[error("plugin used up its budget of {0} instructions (fuel)")]
    FuelExhausted(u64),
    #[error("plugin exceeded its memory limit of {0} bytes")]
    OutOfMemory(usize),
    #[error("plugin trapped: {message}{}", stderr_suffix(.stderr))]
    Trap { message: String, stderr: String },
    #[error("plugin returned {size} bytes, more than the {limit} allowed")]
    OversizedOutput { size: usize, limit: usize },
    #[error("plugin could not be instantiated: {0}")]
    Instantiate(String),
    #[error("plugin is busy: no call slot came free within {0:?}")]
    Busy(Duration),
    #[error("the host's plugin memory budget is used up")]
    HostMemory,
}

impl PluginFault {
    /// A short, bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginFault::Timeout(_) => "timeout",
            PluginFault::FuelExhausted(_) => "fuel",
            PluginFault::OutOfMemory(_) => "out_of_memory",
            PluginFault::Trap { .. } => "trap",
            PluginFault::OversizedOutput { .. } => "oversized_output",
            PluginFault::Instantiate(_) => "instantiate",
            PluginFault::Busy(_) => "busy",
            PluginFault::HostMemory => "host_memory",
        }
    }

    /// Whether the fault may say more about the host than about the plugin: the
    /// wall-clock backstop, no free call slot, the process memory budget. A receiver
    /// answers these with a retry (push 503, pull nack) a bounded number of times.
    pub fn is_transient(&self) -> bool {
        matches!(self, PluginFault::Timeout(_) | PluginFault::Busy(_) | PluginFault::HostMemory)
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() { String::new() } else { format!("; plugin stderr: {s}") }
}

/// Why a plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PluginLoadError {
    #[error("cannot read plugin `{path}`: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("`{path}` is not a valid WebAssembly component: {reason}")]
    Compile { path: PathBuf, reason: String },
    #[error("`{path}` does not implement the inlet:plugin/router world: {reason}")]
    Contract { path: PathBuf, reason: String },
    #[error("`{path}` cannot start within its limits: {reason}")]
    Instantiate { path: PathBuf, reason: String },
    #[error("`{path}` was built against plugin contract {found}, but this host supports {supported}")]
    UnsupportedVersion { path: PathBuf, found: String, supported: &'static str },
    /// The file is not the build its route pins (`plugin = { path, sha256 }`).
    #[error(
        "`{path}` has sha256 {found}, but its route pins sha256 {expected}: only the pinned build may serve (to run this build, pin its digest)"
    )]
    DigestMismatch { path: PathBuf, expected: String, found: String },
}

/// The interface every plugin exports, with the contract version this host speaks.
pub const CONTRACT: &str = "inlet:plugin/handler@0.1.0";

/// The contract's WIT package, the very file `bindgen!` (`bindings.rs`) builds the host
/// from: what `inlet plugin wit` and `inlet plugin new` hand to plugin authors.
pub const WIT: &str = include_str!("../../wit/plugin.wit");

/// A contract version this host loads plugins of.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Contract {
    /// The WIT package, `inlet:plugin@0.1.0`.
    pub package: &'static str,
    /// The interface a plugin exports, `inlet:plugin/handler@0.1.0`.
    pub interface: &'static str,
    /// The package's WIT text, byte for byte.
    #[serde(skip)]
    pub wit: &'static str,
}

/// Every contract version this host supports (today one), newest last.
pub const CONTRACTS: &[Contract] = &[Contract { package: "inlet:plugin@0.1.0", interface: CONTRACT, wit: WIT }];

/// The process-wide engine that runs plugins (fuel and epoch yields on).
pub fn engine() -> &'static Engine {
    engine_for(Metering::Bounded)
}

/// How an engine bounds a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// Fuel (the verdict) and epoch yields (so the backstop can abandon a call).
    Bounded,
    /// No fuel and no yields: only for measuring what the bounds cost. Never for
    /// running plugins: a loop would hold its worker thread forever.
    Unbounded,
}

fn engine_for(metering: Metering) -> &'static Engine {
    static ENGINES: [OnceLock<Engine>; 2] = [OnceLock::new(), OnceLock::new()];
    ENGINES[metering as usize].get_or_init(|| new_engine(metering, |_| {}))
}

/// The engine shadow candidates run on (`crate::shadow`): bounded like [`engine`],
/// with linear memories and fiber stacks that stay mapped ([`resident`]), so a
/// candidate's instances coming and going never change the process's memory map.
fn candidate_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| new_engine(Metering::Bounded, resident::configure))
}

fn new_engine(metering: Metering, more: impl FnOnce(&mut wasmtime::Config)) -> Engine {
    let bounded = metering == Metering::Bounded;
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(bounded);
    config.consume_fuel(bounded);
    more(&mut config);
    let engine = Engine::new(&config).expect("the wasmtime configuration is valid");
    if bounded {
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("inlet-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .expect("spawn the epoch thread");
    }
    engine
}

/// Per-store state: the WASI context and the memory limiter.
struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

struct Warm {
    store: Store<HostState>,
    router: Router,
    stderr: StderrCapture,
    random: CallRandom,
    uses: u32,
}

/// One call into the plugin, and its answer.
enum Call {
    Decode(wit::Message),
    Render(wit::Event),
    Classify(wit::Event, wit::Exchange, wit::Outcome),
}

enum Answer {
    Decode(Result<wit::Decoded, wit::DecodeError>),
    Render(Result<wit::Request, String>),
    Classify(wit::Disposition),
}

impl Warm {
    async fn invoke(&mut self, call: &Call) -> wasmtime::Result<Answer> {
        let handler = self.router.inlet_plugin_handler();
        Ok(match call {
            Call::Decode(msg) => Answer::Decode(handler.call_decode(&mut self.store, msg).await?),
            Call::Render(ev) => Answer::Render(handler.call_render(&mut self.store, ev).await?),
            Call::Classify(ev, exchange, outcome) => {
                Answer::Classify(handler.call_classify(&mut self.store, ev, exchange, outcome).await?)
            }
        })
    }
}

/// A loaded plugin, shared by every worker of its route.
pub struct Plugin {
    path: PathBuf,
    /// SHA-256 of the component's bytes: what a reload compares.
    digest: String,
    pre: RouterPre<HostState>,
    metering: Metering,
    limits: PluginLimits,
    warm: Mutex<Vec<Warm>>,
    pool_size: AtomicUsize,
    /// Call slots: `limits.max_concurrent_calls`.
    slots: tokio::sync::Semaphore,
    /// The process budget its instances are charged to.
    budget: &'static sandbox::MemoryBudget,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.path).field("limits", &self.limits).finish()
    }
}

impl Plugin {
    /// Compiles and type-checks a component, then starts one instance. Slow (tens of
    /// milliseconds) and blocking: do it at start-up or on reload, never per message.
    /// `cache` is a folder of compiled components (see [`compile_cached`]); `None`
    /// compiles every time.
    pub fn load(path: &Path, limits: PluginLimits, cache: Option<&Path>) -> Result<Arc<Plugin>, PluginLoadError> {
        let bytes = std::fs::read(path).map_err(|source| PluginLoadError::Read { path: path.to_path_buf(), source })?;
        Self::from_bytes(path, &bytes, limits, cache)
    }

    pub fn from_bytes(
        path: &Path,
        bytes: &[u8],
        limits: PluginLimits,
        cache: Option<&Path>,
    ) -> Result<Arc<Plugin>, PluginLoadError> {
        Self::with_metering(path, bytes, limits, cache, Metering::Bounded)
    }

    /// Loads a plugin on the engine of the given metering. `Metering::Unbounded` is
    /// for benchmarks only.
    #[doc(hidden)]
    pub fn with_metering(
        path: &Path,
        bytes: &[u8],
        limits: PluginLimits,
        cache: Option<&Path>,
        metering: Metering,
    ) -> Result<Arc<Plugin>, PluginLoadError> {
        Self::build(path, bytes, limits, cache, (engine_for(metering), metering), &sandbox::BUDGET)
    }

    /// A shadow candidate (`crate::shadow`): like [`Plugin::from_bytes`], but its
    /// instances are charged to [`sandbox::SHADOW_BUDGET`], so however much memory it
    /// takes, the serving plugins' budget is untouched.
    pub fn candidate_from_bytes(
        path: &Path,
        bytes: &[u8],
        limits: PluginLimits,
        cache: Option<&Path>,
    ) -> Result<Arc<Plugin>, PluginLoadError> {
        resident::reserve(limits.memory_bytes);
        Self::build(path, bytes, limits, cache, (candidate_engine(), Metering::Bounded), &sandbox::SHADOW_BUDGET)
    }

    fn build(
        path: &Path,
        bytes: &[u8],
        limits: PluginLimits,
        cache: Option<&Path>,
        (engine, metering): (&'static Engine, Metering),
        budget: &'static sandbox::MemoryBudget,
    ) -> Result<Arc<Plugin>, PluginLoadError> {
        let component = compile_cached(engine, path, bytes, cache)?;
        check_contract(path, engine, &component)?;
        let mut linker = Linker::<HostState>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("WASI links into a fresh linker");
        let contract =
            |e: wasmtime::Error| PluginLoadError::Contract { path: path.to_path_buf(), reason: format!("{e:#}") };
        let instance_pre = linker.instantiate_pre(&component).map_err(contract)?;
        let pre = RouterPre::new(instance_pre).map_err(contract)?;
        let digest = crate::inbox::digest_hex(bytes);
        let plugin = Plugin {
            path: path.to_path_buf(),
            digest,
            pre,
            metering,
            slots: tokio::sync::Semaphore::new(limits.max_concurrent_calls.max(1)),
            limits,
            warm: Mutex::new(Vec::new()),
            pool_size: AtomicUsize::new(POOL_SIZE),
            budget,
        };
        // Instantiate once now, so a plugin that cannot start within its limits (too
        // little memory, a trap in its start-up) is refused at load — by `inlet check`
        // and before a reload swaps it in — rather than on its first message.
        let first = on_own_runtime(plugin.instantiate())
            .map_err(|fault| PluginLoadError::Instantiate { path: path.to_path_buf(), reason: fault.to_string() })?;
        plugin.warm.lock().expect("plugin pool lock").push(first);
        Ok(Arc::new(plugin))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }

    async fn instantiate(&self) -> Result<Warm, PluginFault> {
        let stderr = StderrCapture::new(STDERR_CAPACITY);
        let random = CallRandom::new();
        // No preopens and no environment by default; sockets are denied explicitly
        // too. Clocks and randomness are the deterministic ones of `sandbox`.
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(FrozenWallClock)
            .monotonic_clock(FrozenMonotonicClock)
            .secure_random(random.clone())
            .insecure_random(random.clone())
            .insecure_random_seed(0)
            .build();
        let limiter = Limiter::charging(self.limits.memory_bytes, self.budget);
        let mut store = Store::new(self.pre.engine(), HostState { wasi, table: ResourceTable::new(), limiter });
        store.limiter(|s| &mut s.limiter);
        if self.metering == Metering::Bounded {
            store.epoch_deadline_async_yield_and_update(1);
            store.set_fuel(self.limits.fuel).expect("fuel is enabled on this engine");
        }
        match self.pre.instantiate_async(&mut store).await {
            Ok(router) => Ok(Warm { store, router, stderr, random, uses: 0 }),
            Err(e) => Err(self.fault(e, &store, &stderr)),
        }
    }

    /// Turns a failed call into the fault it was.
    fn fault(&self, e: wasmtime::Error, store: &Store<HostState>, stderr: &StderrCapture) -> PluginFault {
        match store.data().limiter.hit {
            Some(LimitHit::Instance) => return PluginFault::OutOfMemory(self.limits.memory_bytes),
            Some(LimitHit::Process) => return PluginFault::HostMemory,
            None => {}
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => return PluginFault::FuelExhausted(self.limits.fuel),
            Some(Trap::Interrupt) => return PluginFault::Timeout(self.limits.call_timeout),
            _ => {}
        }
        // The root cause is the trap itself; the context above it is a wasm backtrace.
        PluginFault::Trap { message: e.root_cause().to_string(), stderr: stderr.text() }
    }

    /// Runs one call under the plugin's limits: a call slot, a warm (or new)
    /// instance with a fresh budget, rewound randomness and an empty stderr, and the
    /// wall-clock backstop over instantiation and call.
    async fn call(&self, call: Call) -> Result<Answer, PluginFault> {
        let backstop = self.limits.call_timeout;
        let Ok(Ok(_slot)) = tokio::time::timeout(backstop, self.slots.acquire()).await else {
            return Err(PluginFault::Busy(backstop));
        };
        let deadline = tokio::time::Instant::now() + backstop;
        let taken = self.warm.lock().expect("plugin pool lock").pop();
        let mut warm = match taken {
            Some(w) => w,
            None => match tokio::time::timeout_at(deadline, self.instantiate()).await {
                Ok(fresh) => fresh?,
                Err(_) => return Err(PluginFault::Timeout(backstop)),
            },
        };
        warm.stderr.clear();
        warm.random.rewind();
        if self.metering == Metering::Bounded {
            warm.store.set_fuel(self.limits.fuel).expect("fuel is enabled on this engine");
            warm.store.set_epoch_deadline(1);
        }
        match tokio::time::timeout_at(deadline, warm.invoke(&call)).await {
            // Abandoned mid-call: the instance goes with the dropped future's state.
            Err(_) => Err(PluginFault::Timeout(backstop)),
            // After any trap the instance is unusable: drop it, the next call
            // instantiates afresh from the pre-instantiated component.
            Ok(Err(e)) => Err(self.fault(e, &warm.store, &warm.stderr)),
            Ok(Ok(answer)) => {
                self.give_back(warm);
                Ok(answer)
            }
        }
    }

    /// Keeps a healthy instance warm, unless it has served its calls, grew past
    /// `keep_warm_mib`, or the pool is full.
    fn give_back(&self, mut warm: Warm) {
        warm.uses += 1;
        if warm.uses >= MAX_USES || warm.store.data().limiter.used() > self.limits.keep_warm_bytes {
            return;
        }
        let mut pool = self.warm.lock().expect("plugin pool lock");
        if pool.len() < self.pool_size.load(Ordering::Relaxed) {
            pool.push(warm);
        }
    }

    /// How many warm instances to keep; 0 makes every call instantiate afresh.
    pub fn set_warm_instances(&self, n: usize) {
        self.pool_size.store(n, Ordering::Relaxed);
        self.warm.lock().expect("plugin pool lock").truncate(n);
    }

    /// `decode`: the plugin's reading of a broker message. The outer error is the
    /// plugin's fault; the inner one its verdict that the message is malformed.
    pub async fn decode(&self, msg: wit::Message) -> Result<Result<wit::Decoded, wit::DecodeError>, PluginFault> {
        let Answer::Decode(out) = self.call(Call::Decode(msg)).await? else { unreachable!("decode answers decode") };
        if let Ok(wit::Decoded::Event(ev)) = &out {
            self.check_size(ev.body.len())?;
        }
        Ok(out)
    }

    pub async fn render(&self, ev: wit::Event) -> Result<Result<wit::Request, String>, PluginFault> {
        let Answer::Render(out) = self.call(Call::Render(ev)).await? else { unreachable!("render answers render") };
        if let Ok(req) = &out {
            self.check_size(
                req.body.len() + req.path.len() + req.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
            )?;
        }
        Ok(out)
    }

    pub async fn classify(
        &self,
        ev: wit::Event,
        exchange: wit::Exchange,
        outcome: wit::Outcome,
    ) -> Result<wit::Disposition, PluginFault> {
        let Answer::Classify(out) = self.call(Call::Classify(ev, exchange, outcome)).await? else {
            unreachable!("classify answers classify")
        };
        if let wit::Disposition::Next(next) = &out {
            self.check_size(next.request.body.len() + next.state.len())?;
        }
        Ok(out)
    }

    /// Bytes the plugin's warm instances hold between calls.
    pub fn warm_bytes(&self) -> usize {
        self.warm.lock().expect("plugin pool lock").iter().map(|w| w.store.data().limiter.used()).sum()
    }
}

/// Runs a future to completion on a private current-thread runtime in a thread of
/// its own, so blocking code (loading a plugin) can drive an async instantiation
/// from anywhere, inside a tokio runtime or not.
fn on_own_runtime<F: Future + Send>(fut: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a current-thread runtime starts")
                .block_on(fut)
        })
        .join()
        .expect("the plugin loading thread does not panic")
    })
}

/// The default folder for compiled components: `$XDG_CACHE_HOME/inlet/components`
/// or `~/.cache/inlet/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("inlet").join("components"))
}

/// Compiles a component, or loads it from `cache` when this exact component was
/// compiled before by a compatible engine. The file name is the SHA-256 of the
/// component's bytes plus a hash of the engine's compatibility settings (wasmtime
/// version and configuration), so a new wasmtime or other settings never load a
/// stale file. Only files this function wrote are ever loaded: the cache folder and
/// each file in it must be Inlet's user's own and not writable by anyone else (files
/// are opened without following links), since loading skips validation.
/// A cache that cannot be read or written is logged and bypassed, never fatal.
pub fn compile_cached(
    engine: &Engine,
    path: &Path,
    bytes: &[u8],
    cache: Option<&Path>,
) -> Result<Component, PluginLoadError> {
    use std::hash::{Hash, Hasher};
    let compile = || {
        Component::new(engine, bytes)
            .map_err(|e| PluginLoadError::Compile { path: path.to_path_buf(), reason: format!("{e:#}") })
    };
    let Some(dir) = cache.filter(|d| private_cache_dir(d)) else { return compile() };
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    let file = dir.join(format!("{}-{:016x}.cwasm", crate::inbox::digest_hex(bytes), h.finish()));
    // Read into memory rather than `deserialize_file`: that maps the file, and a file
    // truncated or rewritten in place while mapped kills the process with SIGBUS.
    match read_own_file(&file) {
        Ok(Some(data)) => {
            // SAFETY: the file was written by `Component::serialize` below, into a
            // folder only this host's user owns and writes, under a name that pins the
            // bytes and the engine; it is that user's own regular file, not a link.
            match unsafe { Component::deserialize(engine, &data) } {
                Ok(c) => return Ok(c),
                Err(error) => {
                    tracing::warn!(file = %file.display(), %error, "cached component unusable; compiling again");
                    let _ = std::fs::remove_file(&file);
                }
            }
        }
        Ok(None) => {}
        Err(problem) => {
            // Not a file this function wrote (a link, another user's, one others
            // may write): compiled afresh, the new file replaces it.
            tracing::error!(file = %file.display(), %problem, "cached component not loaded; compiling again");
        }
    }
    let component = compile()?;
    let written = component.serialize().map_err(std::io::Error::other).and_then(|data| {
        std::fs::create_dir_all(dir)?;
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        write_new_file(&tmp, &data)?;
        // `rename` replaces a link at `file` itself, never what it points to.
        std::fs::rename(&tmp, &file)
    });
    if let Err(error) = written {
        tracing::warn!(dir = %dir.display(), %error, "could not write the compiled-component cache");
    }
    Ok(component)
}

/// The cached component at `file`, if there is one this process may load: opened
/// without following a symbolic link, and only a regular file owned by Inlet's
/// effective user that no one else may write. `Ok(None)` when there is no file; `Err` says why one is refused.
fn read_own_file(file: &Path) -> Result<Option<Vec<u8>>, String> {
    #[cfg(unix)]
    {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let opened =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(file);
        let mut f = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err("it is a symbolic link".into()),
            Err(e) => return Err(format!("cannot open it: {e}")),
        };
        let m = f.metadata().map_err(|e| format!("cannot inspect it: {e}"))?;
        if !m.is_file() {
            return Err("it is not a regular file".into());
        }
        if m.uid() != effective_uid() {
            return Err(format!("it is owned by uid {}, not Inlet's user (uid {})", m.uid(), effective_uid()));
        }
        if m.mode() & 0o022 != 0 {
            return Err(format!("it is writable by group or others (mode {:o})", m.mode() & 0o777));
        }
        let mut data = Vec::with_capacity(m.len() as usize);
        f.read_to_end(&mut data).map_err(|e| format!("cannot read it: {e}"))?;
        Ok(Some(data))
    }
    #[cfg(not(unix))]
    {
        match std::fs::read(file) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read it: {e}")),
        }
    }
}

/// Writes a file that did not exist (a leftover of a crashed run is removed first),
/// private to this user, never through a link.
fn write_new_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path)?.write_all(data)
}

/// The effective uid of this process: whose files the cache may hold.
#[cfg(unix)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Creates the compiled-component cache 0700 where missing, and says whether it is
/// safe to use: a folder owned by another user than Inlet's effective one, or that
/// group or others can write to, is refused (logged as an error, and plugins are
/// compiled without it), because whoever writes a `.cwasm` there runs native code in
/// the host.
fn private_cache_dir(dir: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        if let Err(error) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            tracing::warn!(dir = %dir.display(), %error, "cannot create the compiled-component cache; compiling without it");
            return false;
        }
        match std::fs::metadata(dir) {
            Ok(m) if m.uid() != effective_uid() => {
                tracing::error!(
                    dir = %dir.display(),
                    owner = m.uid(),
                    uid = effective_uid(),
                    "the compiled-component cache is owned by another user; not using it (chown it to Inlet's user)"
                );
                false
            }
            Ok(m) if m.permissions().mode() & 0o022 != 0 => {
                tracing::error!(
                    dir = %dir.display(),
                    mode = format!("{:o}", m.permissions().mode() & 0o777),
                    "the compiled-component cache is writable by group or others; not using it (chmod 700 it)"
                );
                false
            }
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot inspect the compiled-component cache; compiling without it");
                false
            }
        }
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir).is_ok()
    }
}

/// Refuses a component built against another contract version before linking, so
/// the error names both versions instead of a missing export.
fn check_contract(path: &Path, engine: &Engine, component: &Component) -> Result<(), PluginLoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_string()).collect();
    if exports.iter().any(|e| e == CONTRACT) {
        return Ok(());
    }
    let (package, _) = CONTRACT.split_once('@').expect("the contract name has a version");
    let supported = CONTRACT.rsplit('@').next().expect("the contract name has a version");
    match exports.iter().find_map(|e| e.strip_prefix(package).and_then(|v| v.strip_prefix('@'))) {
        Some(found) => {
            Err(PluginLoadError::UnsupportedVersion { path: path.to_path_buf(), found: found.to_string(), supported })
        }
        None => Err(PluginLoadError::Contract {
            path: path.to_path_buf(),
            reason: format!("it exports {exports:?}, not `{CONTRACT}`"),
        }),
    }
}

impl Plugin {
    fn check_size(&self, size: usize) -> Result<(), PluginFault> {
        let limit = self.limits.max_output_bytes;
        if size > limit {
            return Err(PluginFault::OversizedOutput { size, limit });
        }
        Ok(())
    }
}
