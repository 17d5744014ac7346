//! Wiring for `inlet run`: open the inbox, load the routes, serve HTTP, run one relay
//! per route plus the housekeeping tasks, and stop cleanly.
//!
//! Stopping on a signal drains first ([`Running::run_until_signal`]): a load balancer
//! (a Kubernetes Service) goes on routing pushes to an instance for a while after it
//! is told to stop, until it has seen the instance turn unready. So on SIGTERM or
//! SIGINT `/readyz` answers 503 at once while everything keeps running for the drain
//! delay; only then does the listener close, the sources stop and the relays stop
//! claiming, and what is in flight gets the grace period to finish. Pushes that
//! arrive during the delay are stored and answered as usual, so none is refused.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::config::{Config, Ordering, ParkedPolicy};
use crate::delivery::Clients;
use crate::inbox::DbClock;
use crate::inbox::group::{Fleet, Group, Settles};
use crate::inbox::{self, Status};
use crate::ingest::Ingest;
use crate::pubsub_client::Connection;
use crate::relay::RelayOptions;
use crate::routing::{RouteTable, Routes};
use crate::shared::Shared;
use crate::telemetry::{Metrics, RouteStatus};
use crate::{admin, source};

/// Knobs that are not part of the routing file (tests set them).
#[derive(Clone)]
pub struct Options {
    /// The name this instance uses in leases; default `HOST-PID-RANDOM`.
    pub owner: String,
    /// The clock; default follows the database's.
    pub clock: Option<Arc<dyn Clock>>,
    /// Relay poll interval when nothing wakes it.
    pub poll: Duration,
    /// Override of the configured listen address (e.g. port 0 in tests).
    pub listen: Option<SocketAddr>,
    /// Override of `[admin] listen` (only used when the routing file sets one).
    pub admin_listen: Option<SocketAddr>,
    /// How long DONE and IGNORED entries are kept.
    pub retention: Duration,
    /// Folder of compiled plugins, so restarts do not recompile; `None` disables it.
    pub plugin_cache: Option<PathBuf>,
    /// How often the routing file and the plugin files are checked for a new
    /// version (SIGHUP and `POST /api/reload` check at once); `None` checks only on those.
    pub reload_every: Option<Duration>,
    /// Where Pub/Sub sources and targets connect; default `PUBSUB_EMULATOR_HOST`
    /// or Google.
    pub pubsub: Connection,
    /// On a stop signal, how long the listener keeps taking requests while `/readyz`
    /// answers 503 (see [`Running::run_until_signal`]); `Running::stop` does not wait.
    pub drain_delay: Duration,
    /// After the drain delay, how long requests and deliveries in flight may take to
    /// finish; whatever still runs then is abandoned.
    pub grace: Duration,
    /// Fault injection for tests (see `RelayOptions::panic_on_key`).
    #[doc(hidden)]
    pub panic_on_key: Option<String>,
    /// Append every Pub/Sub ack to this file (see [`crate::source::ack_journal`]).
    pub ack_journal: Option<PathBuf>,
    /// What to do about the inbox schema at start (`--migrate`; see UPGRADING.md).
    pub migrate: inbox::MigrateMode,
    /// How long a PostgreSQL migration waits for a lock (`--lock-timeout`).
    pub lock_timeout: Duration,
}

/// The default drain delay: long enough for a Kubernetes Service (kube-proxy,
/// endpoint slices) to stop routing to a pod that turned unready on most clusters.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);

/// The default grace period. With [`DEFAULT_DRAIN_DELAY`] it leaves 5 s of
/// Kubernetes' default 30 s `terminationGracePeriodSeconds` before its SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(20);

impl Default for Options {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "inlet".into());
        Options {
            owner: format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..)),
            clock: None,
            poll: Duration::from_millis(500),
            listen: None,
            admin_listen: None,
            retention: Duration::from_secs(7 * 24 * 3600),
            plugin_cache: crate::plugin::default_cache_dir(),
            reload_every: Some(Duration::from_secs(2)),
            pubsub: Connection::from_env(),
            drain_delay: DEFAULT_DRAIN_DELAY,
            grace: DEFAULT_GRACE,
            panic_on_key: None,
            ack_journal: None,
            migrate: inbox::MigrateMode::Auto,
            lock_timeout: inbox::schema::DEFAULT_LOCK_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] inbox::StoreError),
    #[error("cannot open the ack journal {path}: {source}")]
    AckJournal { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// A started instance.
pub struct Running {
    pub addr: SocketAddr,
    /// Where the admin API listens: `addr`, unless `[admin] listen` gives it its own.
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    /// The HTTP listeners, each with its open connections.
    listeners: JoinSet<()>,
    /// Housekeeping, reloads, repairs, clock calibration, announcements.
    tasks: JoinSet<()>,
    drain_delay: Duration,
    grace: Duration,
    /// SQLite: this instance's hold on the inbox file, released when it stops (held
    /// here, not by the store, which background tasks may outlive the instance with).
    _instance_lock: Option<inbox::InstanceLock>,
}

impl Running {
    /// Stops at once, without a drain delay: closes the listeners (requests in flight
    /// are answered), stops pulling and claiming, and gives what is in flight the
    /// grace period to finish; what still runs then is abandoned (attempts' entries
    /// handed back to the inbox).
    pub async fn stop(self) {
        let Running { shared, shutdown, mut listeners, mut tasks, grace, .. } = self;
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + grace;
        shared.drain.start();
        let _ = shutdown.send(true);
        let listeners = async {
            if join_until(&mut listeners, deadline).await {
                tracing::info!("listener closed; the requests in flight were answered");
            } else {
                tracing::warn!(?grace, "grace period over; closed connections with requests still in flight");
            }
        };
        tokio::join!(listeners, shared.stop_routes(deadline));
        if !join_until(&mut tasks, deadline).await {
            tracing::warn!("grace period over; stopped the background tasks that had not finished");
        }
        tracing::info!(took = ?started.elapsed(), "stopped");
    }

    /// Waits for SIGTERM or SIGINT (ctrl-c), then drains: `/readyz` answers 503
    /// `draining` at once, while the listener keeps taking pushes and admin requests
    /// (each answer closing its connection), the sources keep pulling and the relays
    /// keep delivering for the drain delay. A second signal cuts the delay short.
    /// Then [`Running::stop`], within the grace period. `signals` were installed before
    /// [`start`], whose listeners answer as soon as they are bound: a SIGTERM that
    /// comes right after the first healthy answer (a quick rollout) is a drain, not the
    /// default action that kills the process.
    pub async fn run_until_signal(self, mut signals: Signals) {
        let signal = signals.next().await;
        self.shared.drain.start();
        tracing::info!(
            signal,
            drain_delay = ?self.drain_delay,
            grace = ?self.grace,
            "draining: /readyz answers 503 while the listener keeps taking requests for the drain delay (a second signal ends it)"
        );
        if !self.drain_delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(self.drain_delay) => {
                    tracing::info!("drain delay over; closing the listener, stopping sources and relays");
                }
                signal = signals.next() => {
                    tracing::info!(signal, "second signal; drain delay cut short: closing the listener, stopping sources and relays");
                }
            }
        }
        self.stop().await;
    }
}

/// Waits for the tasks of `set` until `deadline`, then aborts those left. Whether
/// all had finished.
async fn join_until(set: &mut JoinSet<()>, deadline: tokio::time::Instant) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => {
                set.shutdown().await;
                return false;
            }
        }
    }
}

/// The stop signals: SIGTERM (Kubernetes, systemd) and SIGINT (ctrl-c), installed once
/// so the second is caught like the first (the default action would kill the process).
/// Installed before [`start`] (see [`Running::run_until_signal`]); one that arrives
/// meanwhile waits for it.
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                term: signal(SignalKind::terminate()).expect("install the SIGTERM handler"),
                int: signal(SignalKind::interrupt()).expect("install the SIGINT handler"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next signal's name.
    pub async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

pub async fn start(config: &Config, options: Options) -> Result<Running, StartError> {
    // First the SQLite file's instance lock: a second instance is refused before it
    // migrates or touches anything.
    let instance_lock = inbox::InstanceLock::take(&config.store.url, options.migrate == inbox::MigrateMode::Auto)?;
    let store =
        inbox::open_as(&config.store.url, config.store.max_connections, options.migrate, options.lock_timeout).await?;
    let mut tasks = JoinSet::new();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let fleet = Arc::new(Fleet::default());
    let clock: Arc<dyn Clock> = match options.clock.clone() {
        Some(c) => c,
        None => {
            let c = DbClock::new(store.as_ref()).await?;
            fleet.round_trip(c.round_trip());
            let measured = {
                let fleet = Arc::clone(&fleet);
                move |round_trip| fleet.round_trip(round_trip)
            };
            let calibration = Arc::clone(&c).keep_calibrated(Arc::clone(&store), Duration::from_secs(60), measured);
            let mut rx = shutdown_rx.clone();
            tasks.spawn(async move {
                tokio::select! {
                    _ = calibration => {}
                    _ = rx.wait_for(|stop| *stop) => {}
                }
            });
            c
        }
    };
    crate::plugin::sandbox::BUDGET.set_limit(config.plugins.memory_budget_bytes);
    let clients = Clients::new(options.pubsub.clone());
    // A route whose settings or plugin do not load is kept out (reported below); the
    // others start.
    crate::plugin::sandbox::SHADOW_BUDGET.set_limit(config.plugins.shadow_memory_budget_bytes);
    crate::plugin::resident::keep_at_most(config.plugins.shadow_memory_budget_bytes);
    crate::shadow::set_cpu_percent(config.plugins.shadow_cpu_percent);
    crate::shadow::set_memory_churn_mib_per_s(config.plugins.shadow_memory_churn_mib_per_s);
    let metrics = Arc::new(Metrics::new());
    let routes = {
        let (config, cache, clients) = (config.clone(), options.plugin_cache.clone(), clients.clone());
        let metrics = Arc::clone(&metrics);
        tokio::task::spawn_blocking(move || Routes::load(&config, cache.as_deref(), clients, metrics))
            .await
            .expect("loading routes does not panic")
    };
    // The inbox just answered (it was opened and its schema found current).
    metrics.store_up.set(1);
    for outcome in ["ok", "failed"] {
        let _ = metrics.retention_runs.get_or_create(&crate::telemetry::OutcomeLabel { outcome });
    }
    let ack_journal = match &options.ack_journal {
        Some(path) => Some(Arc::new(
            crate::source::ack_journal::AckJournal::open(path)
                .map_err(|source| StartError::AckJournal { path: path.clone(), source })?,
        )),
        None => None,
    };
    let writers = group_commit_writers(store.backend());
    let settles = Arc::new(Group::start(Settles(Arc::clone(&store)), writers, Arc::clone(&fleet)));
    settles.report_to(metrics.group_report("settles"));
    let shared = Arc::new(Shared {
        ingest: Arc::new(
            Ingest::new(Arc::clone(&store), Arc::clone(&clock), Arc::clone(&metrics))
                .with_group_commit(writers, fleet)
                .with_announcements(),
        ),
        pubsub: options.pubsub.clone(),
        ack_journal,
        push_verifier: Arc::new(crate::source::push_auth::Verifier::new()),
        guesses: crate::guesses::Guesses::default(),
        routes: Arc::new(RouteTable::new(Arc::new(Routes::empty(None, clients, Arc::clone(&metrics))))),
        store,
        clock,
        metrics,
        config: Mutex::new(config.clone()),
        config_seen: Mutex::default(),
        relays: Mutex::new(crate::shared::Relays::default()),
        settles,
        drain: crate::server::Drain::default(),
        relay_options: RelayOptions {
            owner: options.owner.clone(),
            poll: options.poll,
            panic_on_key: options.panic_on_key.clone(),
        },
    });

    let addr = options.listen.unwrap_or(config.server.listen);
    let listener = bind(addr).await?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
    let push_limits = source::push::Limits::new(axum::extract::FromRef::from_ref(&shared), &config.server);
    let push = post(source::push::handle)
        .route_layer(axum::middleware::from_fn_with_state(push_limits, source::push::limit))
        .route_layer(DefaultBodyLimit::max(config.server.max_body_bytes));
    let push = Router::new().route("/push/{route}", push).with_state(Arc::clone(&shared));
    let admin = admin_router(&shared);
    // Bound now, served once the routes are in place: a request accepted before would
    // find no route (healthy, yet answering 404 to pushes).
    let mut servers = Vec::new();
    let admin_addr = match config.admin.listen {
        Some(configured) => {
            let admin_listener = bind(options.admin_listen.unwrap_or(configured)).await?;
            let admin_addr = admin_listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
            servers.push(("admin", admin_listener, admin.merge(probes(&shared))));
            servers.push(("server", listener, push.merge(probes(&shared))));
            admin_addr
        }
        None => {
            servers.push(("server", listener, push.merge(admin).merge(probes(&shared))));
            addr
        }
    };
    for warning in config.access_warnings() {
        tracing::warn!("{warning}");
    }
    let names: Vec<String> = routes.iter().map(|r| r.name().to_string()).collect();
    let routes = Arc::new(routes);
    shared.replace_routes(Arc::clone(&routes), &names);
    crate::reload::report(&shared, &routes);
    let mut listeners = JoinSet::new();
    for (name, listener, app) in servers {
        // Paths and methods no endpoint serves are answered as JSON too. The gate and
        // the body bounds are layered last, so they stand in front of the fallbacks too.
        let body_bounds = crate::server::BodyBounds {
            listener: name,
            metrics: Arc::clone(&shared.metrics),
            timeout: config.server.request_timeout,
        };
        let gate = admin::access::Gate { shared: Arc::clone(&shared), listener: name };
        let app = app
            .fallback(admin::answer::not_found)
            .method_not_allowed_fallback(admin::answer::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(body_bounds, crate::server::bound_body))
            .layer(axum::middleware::from_fn_with_state(gate, admin::access::gate))
            .layer(axum::middleware::from_fn_with_state(shared.drain.clone(), crate::server::close_while_draining));
        let bounds = crate::server::Bounds {
            name,
            header_read_timeout: config.server.header_read_timeout,
            max_connections: config.server.max_connections,
            max_connections_per_peer: config.server.max_connections_per_peer,
        };
        listeners.spawn(crate::server::serve(listener, app, bounds, Arc::clone(&shared.metrics), shutdown_rx.clone()));
    }
    crate::reload::remember_applied(&shared);
    tracing::info!(
        %addr,
        %admin_addr,
        routes = names.len(),
        refused = routes.problems().len(),
        store = shared.store.backend(),
        "inlet listening"
    );
    tasks.spawn(housekeeping(Arc::clone(&shared), options.retention, shutdown_rx.clone()));
    if let Some(announced) = shared.store.announcements() {
        tasks.spawn(wake_on_announcements(Arc::clone(&shared), announced, shutdown_rx.clone()));
    }
    tasks.spawn(crate::operate::jobs::run(
        Arc::clone(&shared.store),
        Arc::clone(&shared.clock),
        Arc::clone(&shared) as Arc<dyn crate::operate::Wake>,
        options.owner.clone(),
        shutdown_rx.clone(),
    ));
    tasks.spawn(crate::reload::watch(Arc::clone(&shared), options.reload_every, shutdown_rx));
    Ok(Running {
        addr,
        admin_addr,
        shared,
        shutdown,
        listeners,
        tasks,
        drain_delay: options.drain_delay,
        grace: options.grace,
        _instance_lock: instance_lock,
    })
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })
}

/// The admin API, `/metrics` and the web console, each behind its gate (see
/// `admin::access`, `console::session`).
fn admin_router(shared: &Arc<Shared>) -> Router {
    let api = Router::new()
        .route("/api/entries", get(admin::list))
        .route("/api/entries/{id}", get(admin::show))
        .route("/api/failures", get(admin::failures))
        .route("/api/repairs", get(admin::repairs::list).post(admin::repairs::create))
        .route("/api/entries/{id}/requeue", post(admin::requeue))
        .route("/api/entries/{id}/park", post(admin::park))
        .route("/api/entries/{id}/ignore", post(admin::ignore))
        .route("/api/reload", post(admin::reload))
        .route("/api/routes", get(admin::routes))
        .route("/api/routes/{name}/pause", post(admin::pause_route))
        .route("/api/routes/{name}/resume", post(admin::resume_route))
        .route("/api/routes/{name}/replays", get(admin::replays).post(admin::open_replay))
        .route("/api/replays/{id}", get(admin::replay))
        .route("/api/replays/{id}/close", post(admin::close_replay))
        .route("/api/routes/{name}/shadow", get(admin::shadow))
        .route("/api/routes/{name}/promote", post(admin::promote))
        .route("/api/routes/{name}/rollback", post(admin::rollback))
        .route("/api/purge", post(admin::purge))
        .route("/api/audit", get(admin::audit_log))
        .route("/api/openapi.json", get(admin::openapi::serve))
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(shared), admin::access::authenticate))
        .with_state(Arc::clone(shared));
    let metrics = Router::new()
        .route("/metrics", get(admin::metrics))
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(shared), admin::access::metrics_gate))
        .with_state(Arc::clone(shared));
    api.merge(metrics).merge(crate::console::router(shared))
}

/// `/healthz` and `/readyz`: open on every listener.
fn probes(shared: &Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::readyz))
        .with_state(Arc::clone(shared))
}

/// Wakes the relay of each route another instance (or this one, or a CLI) announced.
async fn wake_on_announcements(
    shared: Arc<Shared>,
    mut announced: tokio::sync::mpsc::UnboundedReceiver<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let route = tokio::select! {
            route = announced.recv() => route,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Some(route) = route else { return };
        if let Some(r) = shared.routes().get(&route) {
            r.stored.notify_one();
        }
    }
}

/// Tasks committing push inserts (and, apart, settles) in groups, by backend. On
/// PostgreSQL two: one gathers a batch while the other's round trips and commit are
/// out. More only make the batches smaller, and a small batch costs PostgreSQL more per
/// row. (With other instances on the database, or with the database near, the second
/// commits beside the first only a full batch: `inbox::group::Fleet`.) On SQLite one:
/// the file has one writer lock, and a second writer only waits in SQLite's busy
/// handler, which sleeps in steps of milliseconds; one writer takes the next batch the
/// moment the last commits. (Figures: docs/measurements.md.)
fn group_commit_writers(backend: &str) -> usize {
    if backend == "sqlite" { 1 } else { 2 }
}

/// Rows one retention statement deletes at most.
const PURGE_BATCH: u32 = 1_000;

/// How often housekeeping runs: `inlet_store_up`, the gauge lease, maintenance.
const HOUSEKEEPING_TICK: Duration = Duration::from_secs(5);

/// The inbox gauges are counted over every unresolved entry, so their queries grow
/// with the backlog: at a million entries, refreshed every tick, they would take a
/// quarter of a core from the relay (docs/measurements.md). So the next refresh waits
/// this many times as long as the last took
/// (never less than a tick, never more than [`GAUGES_AT_MOST_EVERY`]): the gauges
/// cost at most a twentieth of one connection's time. A small inbox (milliseconds)
/// is still refreshed every tick.
const GAUGE_COST_FACTOR: u32 = 20;

/// The longest the inbox gauges go without a refresh, however long it takes.
const GAUGES_AT_MOST_EVERY: Duration = Duration::from_secs(60);

/// When the inbox gauges are next due, from what the last refresh cost.
#[derive(Debug, Default)]
struct GaugePace {
    next: Option<std::time::Instant>,
    /// The last refresh was costly enough to wait longer than a tick.
    slowed: bool,
}

impl GaugePace {
    fn due(&self) -> bool {
        self.next.is_none_or(|at| std::time::Instant::now() >= at)
    }

    /// After a refresh whose inbox queries took `cost`.
    fn refreshed(&mut self, cost: Duration) {
        let interval = gauge_interval(cost);
        let slowed = interval > HOUSEKEEPING_TICK;
        if slowed != self.slowed {
            if slowed {
                tracing::info!(
                    ?cost,
                    ?interval,
                    "the inbox gauges are costly to count over this backlog; refreshing them less often"
                );
            } else {
                tracing::info!(?cost, "the inbox gauges are cheap again; refreshing them every housekeeping tick");
            }
        }
        self.slowed = slowed;
        // Due a little before the tick that would be late, so a tick's jitter does
        // not skip a whole tick.
        self.next = Some(std::time::Instant::now() + interval.saturating_sub(HOUSEKEEPING_TICK / 10));
    }

    /// A new publisher counts at once.
    fn reset(&mut self) {
        *self = GaugePace::default();
    }
}

/// How long to wait after a refresh of the inbox gauges that took `cost`.
fn gauge_interval(cost: Duration) -> Duration {
    (cost * GAUGE_COST_FACTOR).clamp(HOUSEKEEPING_TICK, GAUGES_AT_MOST_EVERY)
}

/// Refreshes the backlog gauges, keeps the inbox table vacuumed (PostgreSQL) and
/// purges finished entries past their retention.
async fn housekeeping(shared: Arc<Shared>, retention: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(HOUSEKEEPING_TICK);
    let mut since_purge = Duration::ZERO;
    let mut published = HashSet::new();
    let mut pace = GaugePace::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        refresh_gauges(&shared, &mut published, &mut pace).await;
        // One instance keeps the shared table quick to claim from: the one that holds
        // the gauge lease, as `refresh_gauges` just found.
        if shared.metrics.gauges_publisher.get() == 1 {
            match shared.store.maintain().await {
                Ok(Some(done)) => tracing::info!(%done, "inbox maintenance"),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "inbox maintenance failed; will try again"),
            }
        }
        since_purge += HOUSEKEEPING_TICK;
        if since_purge >= Duration::from_secs(60) {
            since_purge = Duration::ZERO;
            let before = crate::clock::ago(shared.clock.now(), retention);
            // Small batches with a pause between them: the relay's claims and settles
            // get the database in between, and any backlog is cleared in one round.
            let outcome = match purge_expired(&shared, before).await {
                Ok(0) => "ok",
                Ok(n) => {
                    tracing::info!(purged = n, "purged finished entries past their retention");
                    "ok"
                }
                Err(error) => {
                    tracing::warn!(%error, "retention purge failed; will try again");
                    "failed"
                }
            };
            shared.metrics.retention_runs.get_or_create(&crate::telemetry::OutcomeLabel { outcome }).inc();
        }
    }
}

/// Purges the finished entries that finished before `before`, first deleting the
/// claim-check objects of routes that ask for it (`fetch.delete_on_purge`). An object
/// whose delete fails is counted and logged and its entry purged all the same: the
/// object outlives its message (the store's lifecycle rules can take it), nothing the
/// inbox needs is lost. Returns how many entries were purged.
pub async fn purge_expired(shared: &Shared, before: crate::clock::Millis) -> Result<u64, inbox::StoreError> {
    for route in shared.routes().iter() {
        let Some(fetcher) = route.fetcher().filter(|f| f.deletes_on_purge()) else { continue };
        let mut after = 0;
        loop {
            let page = shared.store.purgeable(route.name(), before, after, PURGE_BATCH).await?;
            let Some(&(last, _)) = page.last() else { break };
            for (id, attributes) in &page {
                let outcome = match fetcher.delete(attributes).await {
                    Ok(false) => continue,
                    Ok(true) => "deleted",
                    Err(error) => {
                        tracing::warn!(route = route.name(), entry = id, %error, "could not delete the claim-check object of a purged entry; it stays in the store");
                        "failed"
                    }
                };
                let label = crate::telemetry::Metrics::outcome(route.name(), outcome);
                shared.metrics.fetch_deletes.get_or_create(&label).inc();
            }
            after = last;
        }
    }
    inbox::purge_all(shared.store.as_ref(), before, PURGE_BATCH, Duration::from_millis(20)).await
}

/// Sets `inlet_store_up` (every instance) and, on the one instance holding the gauge
/// lease, the gauges computed from the shared inbox; the others drop those series
/// (see `crate::telemetry`). `published`: the routes whose series this instance set
/// last time, so a route that is gone loses its series.
async fn refresh_gauges(shared: &Shared, published: &mut HashSet<String>, pace: &mut GaugePace) {
    let m = &shared.metrics;
    let was_up = m.store_up.get() == 1;
    if let Err(error) = shared.store.db_now().await {
        if was_up {
            tracing::error!(%error, "the inbox does not answer (inlet_store_up 0); ingest nacks and the relay waits");
        }
        m.store_up.set(0);
        return;
    }
    if !was_up {
        tracing::info!("the inbox answers again (inlet_store_up 1)");
    }
    m.store_up.set(1);
    let publisher = match shared.store.gauge_lease().await {
        Ok(held) => held,
        Err(error) => {
            tracing::warn!(%error, "could not keep or take the inbox gauge lease; not publishing the inbox gauges");
            false
        }
    };
    if publisher != (m.gauges_publisher.get() == 1) {
        if publisher {
            tracing::info!("this instance publishes the inbox gauges now (inlet_inbox_gauges_publisher 1)");
        } else {
            tracing::info!("another instance publishes the inbox gauges (inlet_inbox_gauges_publisher 0)");
        }
    }
    m.gauges_publisher.set(i64::from(publisher));
    if !publisher {
        m.clear_inbox_gauges();
        published.clear();
        pace.reset();
        return;
    }
    if !pace.due() {
        return;
    }
    let started = std::time::Instant::now();
    let counts = match shared.store.counts().await {
        Ok(c) => c,
        Err(error) => {
            tracing::warn!(%error, "could not read inbox counts for metrics");
            return;
        }
    };
    let now = shared.clock.now();
    let age = |since: Option<crate::clock::Millis>| since.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
    let routes = shared.routes();
    for route in routes.iter() {
        let name = route.name();
        for status in crate::telemetry::UNRESOLVED {
            let row = counts.iter().find(|c| c.route == name && c.status == status);
            let label = RouteStatus { route: name.to_string(), status: status.as_str() };
            m.entries.get_or_create(&label).set(row.map_or(0, |r| r.count));
            let oldest = age(row.and_then(|r| r.oldest_received_at));
            m.oldest_age_seconds.get_or_create(&label).set(oldest);
            if status == Status::Open {
                m.oldest_open_age_seconds.get_or_create(&Metrics::route(name)).set(oldest);
            }
        }
        // Keys hold nothing back on an unordered route.
        let blocked = if route.config.ordering == Ordering::PerKey {
            match shared.store.blocked_keys(name, route.config.parked == ParkedPolicy::BlockKey).await {
                Ok(b) => b,
                Err(error) => {
                    tracing::warn!(route = name, %error, "could not read blocked keys for metrics");
                    continue;
                }
            }
        } else {
            inbox::BlockedKeys::default()
        };
        m.blocked_keys.get_or_create(&Metrics::route(name)).set(blocked.keys);
        m.oldest_blocked_key_age_seconds.get_or_create(&Metrics::route(name)).set(age(blocked.oldest_head_received_at));
    }
    let now_published: HashSet<String> = routes.iter().map(|r| r.name().to_string()).collect();
    for gone in published.difference(&now_published) {
        let label = Metrics::route(gone);
        m.oldest_open_age_seconds.remove(&label);
        m.blocked_keys.remove(&label);
        m.oldest_blocked_key_age_seconds.remove(&label);
        for status in crate::telemetry::UNRESOLVED {
            let label = RouteStatus { route: gone.clone(), status: status.as_str() };
            m.entries.remove(&label);
            m.oldest_age_seconds.remove(&label);
        }
    }
    *published = now_published;
    pace.refreshed(started.elapsed());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costly_gauges_are_refreshed_less_often_within_bounds() {
        // Milliseconds (a small inbox): every tick.
        assert_eq!(gauge_interval(Duration::from_millis(4)), HOUSEKEEPING_TICK);
        // A second (a backlog of about a million): twenty seconds.
        assert_eq!(gauge_interval(Duration::from_secs(1)), Duration::from_secs(20));
        // Whatever it costs, at least once a minute.
        assert_eq!(gauge_interval(Duration::from_secs(30)), GAUGES_AT_MOST_EVERY);
        let mut pace = GaugePace::default();
        assert!(pace.due(), "the first refresh is due at once");
        pace.refreshed(Duration::from_secs(1));
        assert!(!pace.due(), "a costly refresh is not repeated at the next tick");
        pace.reset();
        assert!(pace.due(), "a new publisher counts at once");
    }
}
