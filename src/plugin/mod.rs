//! The plugin host: loads WebAssembly components that implement the `inlet:plugin`
//! world and calls them inside a sandbox.
//!
//! One [`wasmtime::Engine`] for the process; per plugin a pre-instantiated
//! component (`RouterPre`, type-checked at load) and a small pool of warm instances.
//! Every call runs under an epoch deadline and a memory cap, on a blocking thread.
//! An instance that trapped or hit a limit is discarded; a healthy one is reused
//! for up to [`MAX_USES`] calls, because instantiating per call costs about five
//! times a warm call.
//!
//! Plugins get WASI only because Rust's standard library imports it: no preopened
//! directories, no environment, no sockets; stderr goes to a small in-memory pipe
//! whose contents explain a panic.

mod bindings;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use bindings::types as wit;
use bindings::{Router, RouterPre};

use crate::config::PluginLimits;

/// Calls a warm instance serves before it is replaced.
pub const MAX_USES: u32 = 10_000;
/// Warm instances kept per plugin.
const POOL_SIZE: usize = 16;
/// Epoch tick; call deadlines are rounded up to it.
const TICK: Duration = Duration::from_millis(5);
/// Bytes of guest stderr kept per instance (the start of a panic message).
const STDERR_CAPACITY: usize = 16 * 1024;

/// A failure that is the plugin's fault. The entry is parked (decode, render) or the
/// attempt counts as failed (classify); the host carries on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginFault {
    #[error("plugin exceeded its call time limit of {0:?}")]
    Timeout(Duration),
    #[error("plugin used up its fuel of {0} instructions")]
    FuelExhausted(u64),
    #[error("plugin exceeded its memory limit of {0} bytes")]
    OutOfMemory(usize),
    #[error("plugin trapped: {message}{}", stderr_suffix(.stderr))]
    Trap { message: String, stderr: String },
    #[error("plugin returned {size} bytes, more than the {limit} allowed")]
    OversizedOutput { size: usize, limit: usize },
    #[error("plugin could not be instantiated: {0}")]
    Instantiate(String),
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
        }
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
}

/// The interface every plugin exports, with the contract version this host speaks.
pub const CONTRACT: &str = "inlet:plugin/handler@0.1.0";

/// The process-wide engines — one plain, one counting fuel, since fuel is an engine
/// setting that costs every call — each with a thread that advances its epoch every
/// [`TICK`]. A component compiled by one cannot run on the other.
pub fn engine(fuel: bool) -> &'static Engine {
    engine_for(if fuel { Metering::EpochAndFuel } else { Metering::Epoch })
}

/// How an engine bounds a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// A wall-clock deadline (every plugin).
    Epoch,
    /// A deadline and an instruction budget (routes with `limits.fuel`).
    EpochAndFuel,
    /// No deadline at all: only for measuring what the deadline costs. Never for
    /// running plugins: a loop would hold its thread forever.
    #[doc(hidden)]
    Unbounded,
}

fn engine_for(metering: Metering) -> &'static Engine {
    static ENGINES: [OnceLock<Engine>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    ENGINES[metering as usize].get_or_init(|| {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(metering != Metering::Unbounded);
        config.consume_fuel(metering == Metering::EpochAndFuel);
        let engine = Engine::new(&config).expect("the wasmtime configuration is valid");
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
        engine
    })
}

/// Per-store state: the (empty) WASI context and the memory limiter.
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

/// Caps linear memory and remembers whether the cap was hit, so a failed call can
/// be reported as out-of-memory rather than a bare trap.
struct Limiter {
    memory_bytes: usize,
    hit: bool,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.hit = true;
            return Err(wasmtime::Error::msg(format!("memory limit of {} bytes reached", self.memory_bytes)));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

struct Warm {
    store: Store<HostState>,
    router: Router,
    stderr: MemoryOutputPipe,
    uses: u32,
}

/// A loaded plugin, shared by every worker of its route.
pub struct Plugin {
    path: PathBuf,
    /// SHA-256 of the component's bytes: what a reload compares.
    digest: String,
    pre: RouterPre<HostState>,
    limits: PluginLimits,
    warm: Mutex<Vec<Warm>>,
    pool_size: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.path).field("limits", &self.limits).finish()
    }
}

impl Plugin {
    /// Compiles and type-checks a component. Slow (tens of milliseconds): do it at
    /// start-up or on reload, never per message.
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
        let metering = if limits.fuel.is_some() { Metering::EpochAndFuel } else { Metering::Epoch };
        Self::with_metering(path, bytes, limits, cache, metering)
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
        let engine = engine_for(metering);
        let component = compile_cached(engine, path, bytes, cache)?;
        check_contract(path, engine, &component)?;
        let mut linker = Linker::<HostState>::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).expect("WASI links into a fresh linker");
        let contract =
            |e: wasmtime::Error| PluginLoadError::Contract { path: path.to_path_buf(), reason: format!("{e:#}") };
        let instance_pre = linker.instantiate_pre(&component).map_err(contract)?;
        let pre = RouterPre::new(instance_pre).map_err(contract)?;
        let digest = crate::inbox::digest_hex(bytes);
        let plugin = Plugin {
            path: path.to_path_buf(),
            digest,
            pre,
            limits,
            warm: Mutex::new(Vec::new()),
            pool_size: std::sync::atomic::AtomicUsize::new(POOL_SIZE),
        };
        // Instantiate once now, so a plugin that cannot start within its limits (too
        // little memory, a trap in its start-up) is refused at load — by `inlet check`
        // and before a reload swaps it in — rather than on its first message.
        let first = plugin
            .instantiate()
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

    fn instantiate(&self) -> Result<Warm, PluginFault> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        // No preopens and no environment by default; sockets are denied explicitly too.
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limiter = Limiter { memory_bytes: self.limits.memory_bytes, hit: false };
        let mut store = Store::new(self.pre.engine(), HostState { wasi, table: ResourceTable::new(), limiter });
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        if let Some(fuel) = self.limits.fuel {
            store.set_fuel(fuel).expect("fuel is enabled on this engine");
        }
        let router = self.pre.instantiate(&mut store).map_err(|e| self.fault(e, &store, &stderr))?;
        Ok(Warm { store, router, stderr, uses: 0 })
    }

    fn deadline_ticks(&self) -> u64 {
        (self.limits.call_timeout.as_micros() / TICK.as_micros()).max(1) as u64 + 1
    }

    /// Turns a failed call into the fault it was.
    fn fault(&self, e: wasmtime::Error, store: &Store<HostState>, stderr: &MemoryOutputPipe) -> PluginFault {
        if store.data().limiter.hit {
            return PluginFault::OutOfMemory(self.limits.memory_bytes);
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => return PluginFault::Timeout(self.limits.call_timeout),
            Some(Trap::OutOfFuel) => return PluginFault::FuelExhausted(self.limits.fuel.unwrap_or_default()),
            _ => {}
        }
        let stderr = String::from_utf8_lossy(&stderr.contents()).into_owned();
        // The root cause is the trap itself; the context above it is a wasm backtrace.
        PluginFault::Trap { message: e.root_cause().to_string(), stderr }
    }

    /// Runs `f` on a warm instance under the call limits. Blocking: call it from a
    /// blocking thread.
    fn call_blocking<R>(
        &self,
        f: impl FnOnce(&Router, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginFault> {
        let taken = self.warm.lock().expect("plugin pool lock").pop();
        let mut warm = match taken {
            Some(w) => w,
            None => self.instantiate()?,
        };
        warm.store.set_epoch_deadline(self.deadline_ticks());
        if let Some(fuel) = self.limits.fuel {
            warm.store.set_fuel(fuel).expect("fuel is enabled on this engine");
        }
        match f(&warm.router, &mut warm.store) {
            Ok(r) => {
                warm.uses += 1;
                if warm.uses < MAX_USES {
                    let mut pool = self.warm.lock().expect("plugin pool lock");
                    if pool.len() < self.pool_size.load(std::sync::atomic::Ordering::Relaxed) {
                        pool.push(warm);
                    }
                }
                Ok(r)
            }
            // After any trap the instance is unusable: drop it, the next call
            // instantiates afresh from the pre-instantiated component.
            Err(e) => Err(self.fault(e, &warm.store, &warm.stderr)),
        }
    }

    /// Runs a blocking plugin call on tokio's blocking pool.
    async fn off_thread<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Plugin) -> Result<R, PluginFault> + Send + 'static,
    ) -> Result<R, PluginFault> {
        let this = Arc::clone(self);
        match tokio::task::spawn_blocking(move || f(&this)).await {
            Ok(r) => r,
            Err(join) => {
                Err(PluginFault::Trap { message: format!("plugin call thread failed: {join}"), stderr: String::new() })
            }
        }
    }

    /// How many warm instances to keep; 0 makes every call instantiate afresh.
    pub fn set_warm_instances(&self, n: usize) {
        self.pool_size.store(n, std::sync::atomic::Ordering::Relaxed);
        self.warm.lock().expect("plugin pool lock").truncate(n);
    }

    /// `decode`: the plugin's reading of a broker message. The outer error is the
    /// plugin's fault; the inner one its verdict that the message is malformed.
    pub async fn decode(
        self: &Arc<Self>,
        msg: wit::Message,
    ) -> Result<Result<wit::Decoded, wit::DecodeError>, PluginFault> {
        self.off_thread(move |p| p.decode_blocking(msg)).await
    }

    pub async fn render(self: &Arc<Self>, ev: wit::Event) -> Result<Result<wit::Request, String>, PluginFault> {
        self.off_thread(move |p| p.render_blocking(ev)).await
    }

    pub async fn classify(
        self: &Arc<Self>,
        ev: wit::Event,
        exchange: wit::Exchange,
        outcome: wit::Outcome,
    ) -> Result<wit::Disposition, PluginFault> {
        self.off_thread(move |p| p.classify_blocking(ev, exchange, outcome)).await
    }

    /// [`Plugin::decode`] on the calling thread (benchmarks, tools).
    pub fn decode_blocking(&self, msg: wit::Message) -> Result<Result<wit::Decoded, wit::DecodeError>, PluginFault> {
        let out = self.call_blocking(move |r, s| r.inlet_plugin_handler().call_decode(s, &msg))?;
        if let Ok(wit::Decoded::Event(ev)) = &out {
            self.check_size(ev.body.len())?;
        }
        Ok(out)
    }

    pub fn render_blocking(&self, ev: wit::Event) -> Result<Result<wit::Request, String>, PluginFault> {
        let out = self.call_blocking(move |r, s| r.inlet_plugin_handler().call_render(s, &ev))?;
        if let Ok(req) = &out {
            self.check_size(
                req.body.len() + req.path.len() + req.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
            )?;
        }
        Ok(out)
    }

    pub fn classify_blocking(
        &self,
        ev: wit::Event,
        exchange: wit::Exchange,
        outcome: wit::Outcome,
    ) -> Result<wit::Disposition, PluginFault> {
        let out =
            self.call_blocking(move |r, s| r.inlet_plugin_handler().call_classify(s, &ev, &exchange, &outcome))?;
        if let wit::Disposition::Next(next) = &out {
            self.check_size(next.request.body.len() + next.state.len())?;
        }
        Ok(out)
    }
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
/// stale file. Only files this function wrote are ever loaded: the cache folder must
/// not be writable by anyone the host does not trust, since loading skips validation.
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
    if let Ok(data) = std::fs::read(&file) {
        // SAFETY: the file was written by `Component::serialize` below, into a folder
        // only this host writes, under a name that pins the bytes and the engine.
        match unsafe { Component::deserialize(engine, &data) } {
            Ok(c) => return Ok(c),
            Err(error) => {
                tracing::warn!(file = %file.display(), %error, "cached component unusable; compiling again");
                let _ = std::fs::remove_file(&file);
            }
        }
    }
    let component = compile()?;
    let written = component.serialize().map_err(std::io::Error::other).and_then(|data| {
        std::fs::create_dir_all(dir)?;
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, data)?;
        std::fs::rename(&tmp, &file)
    });
    if let Err(error) = written {
        tracing::warn!(dir = %dir.display(), %error, "could not write the compiled-component cache");
    }
    Ok(component)
}

/// Creates the compiled-component cache 0700 where missing, and says whether it is
/// safe to use: a folder that group or others can write to is refused (logged, and
/// plugins are compiled without it), because whoever writes a `.cwasm` there runs
/// native code in the host.
fn private_cache_dir(dir: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if let Err(error) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            tracing::warn!(dir = %dir.display(), %error, "cannot create the compiled-component cache; compiling without it");
            return false;
        }
        match std::fs::metadata(dir) {
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
