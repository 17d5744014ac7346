//! The `inlet` command line. Output for people goes to stdout (tables, or JSON with
//! `--json`); errors go to stderr once, as `error: …`, with a non-zero exit; logs go
//! to stderr too (only warnings and errors, except for `inlet run`).

mod rollout;
mod schema;
mod view;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::admin::answer::AuditPage;
use crate::app;
use crate::clock::Clock;
use crate::config::Config;
use crate::delivery::Clients;
use crate::inbox::DbClock;
use crate::inbox::repair::RepairAction;
use crate::inbox::{self, ListFilter, Status, Store};
use crate::operate::audit::cli_actor;
use crate::operate::{EntryRepair, Inputs, JobPlan, Operator, PauseView, Reason, Refusal, Relays, Repaired};
use crate::pubsub_client::Connection;
use crate::routing::Routes;

#[derive(Debug, Parser)]
#[command(
    name = "inlet",
    version = crate::build_info::SHORT.as_str(),
    long_version = crate::build_info::LONG.as_str(),
    about = "Pub/Sub in, transactional inbox, ordered relay out — extended by WebAssembly plugins"
)]
pub struct Cli {
    /// The routing file, or a directory of them (default: `INLET_CONFIG`). Accepted
    /// anywhere on the line; `run`, `check` and `pubsub setup` also take it as their
    /// argument. `inbox` reads only its `[store]`.
    #[arg(long, short, global = true, env = "INLET_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables: one document for a read command, one object per
    /// line for a repair (the bodies of the admin API, see API.md).
    #[arg(long, global = true)]
    pub json: bool,
    /// How log lines (on stderr) are written: `text`, or `json` (one object per line,
    /// with the fields of the spans it ran in: route, entry id, key, message id).
    #[arg(long, global = true, env = "INLET_LOG_FORMAT", value_enum, default_value_t = crate::telemetry::LogFormat::Text)]
    pub log_format: crate::telemetry::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the routes of a routing file (or a directory of them): receive, store, relay.
    /// A route whose settings or plugin do not load is kept out and reported; the
    /// others run.
    Run {
        /// The routing file (TOML), or a directory of routing files (`*.toml`, one per
        /// team, read in name order; one of them holds `[store]` and `[server]`).
        /// Default: `--config`.
        #[arg(value_name = "CONFIG")]
        routing: Option<PathBuf>,
        /// Listen here instead of `[server] listen`.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Name of this instance in leases (default: host, pid and a random suffix).
        #[arg(long, env = "INLET_INSTANCE")]
        instance: Option<String>,
        /// Relay poll interval when nothing wakes it.
        #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
        poll: Duration,
        /// How long DONE and IGNORED entries are kept.
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        retention: Duration,
        /// Folder for compiled plugins (default ~/.cache/inlet/components); `off` disables it.
        #[arg(long, env = "INLET_PLUGIN_CACHE")]
        plugin_cache: Option<PathBuf>,
        /// On SIGTERM or ctrl-c, how long to keep taking pushes (and admin requests)
        /// while `/readyz` answers 503 `draining`, so a load balancer stops sending
        /// pushes here before the listener closes. A second signal cuts it short. `0s`
        /// where nothing routes to this instance by its readiness (pull routes only).
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        drain_delay: Duration,
        /// After the drain delay, how long requests and deliveries in flight may take
        /// to finish; what still runs then is abandoned (its entries handed back to be
        /// delivered again). Under Kubernetes set terminationGracePeriodSeconds to at
        /// least drain delay + grace + 5s (the defaults, 5s + 20s, fit its default 30),
        /// or its SIGKILL comes first.
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// Append every Pub/Sub message id Inlet acks to this file, after its row is
        /// committed (`ROUTE<TAB>ID` lines): lets a test or an audit check that
        /// nothing was acked without its row.
        #[arg(long, env = "INLET_ACK_JOURNAL")]
        ack_journal: Option<PathBuf>,
        /// What to do about the inbox schema at start: `auto` applies pending
        /// migrations (and creates a missing SQLite file); `check` refuses to start
        /// unless the schema is this binary's, changing nothing — for production, with
        /// `inlet migrate` run as a step of its own first; `off` neither, except that a
        /// schema newer than this binary knows is refused in every mode. See UPGRADING.md.
        #[arg(long, env = "INLET_MIGRATE", value_enum, default_value_t = inbox::MigrateMode::Auto)]
        migrate: inbox::MigrateMode,
        /// PostgreSQL: how long a migration (`--migrate auto`) waits for a lock another
        /// session holds before it fails (`0s`: no limit).
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        lock_timeout: Duration,
    },
    /// Apply the inbox schema migrations this binary knows and the inbox lacks, in one
    /// transaction, each recorded with this binary's version and the checksum of its
    /// SQL; creates a missing SQLite file. Production runs this as a step of its own
    /// (a Kubernetes Job) before starting instances with `inlet run --migrate check`.
    /// Refuses a schema newer than this binary's, one migrated with other SQL, and a
    /// SQLite inbox an instance is running on. Reads only the `[store]` of the routing
    /// file.
    Migrate {
        /// The routing file or directory (default: `--config`).
        #[arg(value_name = "CONFIG")]
        routing: Option<PathBuf>,
        /// Print the SQL each pending version would run; change and create nothing.
        #[arg(long)]
        dry_run: bool,
        /// PostgreSQL: how long to wait for a lock another session holds before
        /// failing with nothing applied (`0s`: no limit).
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        lock_timeout: Duration,
    },
    /// The inbox schema (reads only the `[store]` of `--config`; changes nothing).
    Schema {
        #[command(subcommand)]
        command: SchemaCommand,
    },
    /// Validate a routing file (or a directory of them) and load its plugins; exit 1
    /// listing every error and every refused route.
    Check {
        /// The routing file or directory (default: `--config`).
        #[arg(value_name = "CONFIG")]
        routing: Option<PathBuf>,
    },
    /// Google Pub/Sub tools (honour PUBSUB_EMULATOR_HOST).
    Pubsub {
        #[command(subcommand)]
        command: PubsubCommand,
    },
    /// Tools for plugin authors.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Pause and resume routes, for every instance at once (works whether or not Inlet is
    /// running; reads the `[store]` and the route names of `--config`).
    Route {
        #[command(subcommand)]
        command: RouteCommand,
    },
    /// Inspect and repair the inbox (works whether or not Inlet is running). Only the
    /// `[store]` of `--config` is read: plugin files and target secrets need not be there.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// The inbox's schema version, the versions this binary knows, the pending ones,
    /// and who applied each (binary version, the checksum of its SQL against this
    /// binary's). Exit 0 when this binary runs on the schema as it is, 1 otherwise.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum PubsubCommand {
    /// Create the topics and subscriptions a routing file names, where missing:
    /// target topics, source topics, dead-letter topics and subscriptions (ordered
    /// when the route is, with a retry policy, the dead-letter policy if set, and the
    /// acked-message retention if `retain_acked` is set). An existing subscription's
    /// retention is set to its route's `retain_acked` where it differs (printed as
    /// `updated …`); nothing else of it is changed.
    Setup {
        /// The routing file or directory (default: `--config`).
        #[arg(value_name = "CONFIG")]
        routing: Option<PathBuf>,
    },
    /// Seek subscriptions back to a time, after restoring the inbox from a backup:
    /// what was published from then on is delivered again (the inbox keeps one entry
    /// per route and dedup key, so what it holds already is a duplicate, acked and
    /// dropped), and what was published before counts as acked. The subscription
    /// must retain acked messages (`retain_acked`). RUNBOOK.md, "Backups and restore".
    #[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["routes", "subscriptions", "all"]))]
    Seek {
        /// The route (of `--config`) whose pull subscription to seek; repeatable.
        #[arg(long = "route", value_name = "NAME")]
        routes: Vec<String>,
        /// A subscription to seek, `projects/P/subscriptions/S` (a push route's, which
        /// the routing file does not name); repeatable.
        #[arg(long = "subscription", value_name = "NAME")]
        subscriptions: Vec<String>,
        /// Every route of `--config` that pulls from a subscription.
        #[arg(long)]
        all: bool,
        /// The time to go back to, RFC 3339: the time `inlet inbox backup` printed,
        /// or a PostgreSQL snapshot's.
        #[arg(long, value_name = "TIME", value_parser = crate::pubsub_client::parse_time)]
        to: std::time::SystemTime,
        /// Go back this much further than `--to`: the longest a message waited in the
        /// subscription when the backup was taken (a message published before `--to`
        /// but acked after it is otherwise lost), e.g. `15m`.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        margin: Duration,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run a plugin's decode, render and (with --response) classify on files, and print
    /// what each step produced (`--json`: as one document). Exits 1 when the plugin
    /// fails: a decode error, a fault (trap, timeout, memory), an answer a route's
    /// output rules refuse.
    Test {
        /// The plugin component (`.wasm`). Default with `--route`: the route's plugin.
        plugin: Option<PathBuf>,
        /// Take the sandbox limits and output rules (and, without PLUGIN, the plugin)
        /// of this route of `--config`; without it, the default limits and no rules.
        #[arg(long, value_name = "NAME")]
        route: Option<String>,
        /// The message payload, as the broker would deliver it.
        #[arg(long)]
        message: PathBuf,
        /// A broker attribute, `NAME=VALUE`; repeatable.
        #[arg(long = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, String)>,
        /// The broker's message id (the dedup key unless the plugin names one).
        #[arg(long, default_value = "test-message-1")]
        message_id: String,
        /// The target's answer as JSON: `{"status": 400, "headers": {…}, "body": …}` or
        /// `{"transport_error": "timeout", "message": "…"}`. Repeat it for each step of
        /// a multi-step exchange.
        #[arg(long = "response")]
        responses: Vec<PathBuf>,
    },
    /// Print each file's SHA-256 as `SHA256  FILE` lines: the value a route pins with
    /// `plugin = { path = "…", sha256 = "…" }`.
    Digest {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Write a new plugin project into a folder of its own (default ./NAME): the code,
    /// the contract's WIT as this host checks it, sample messages and target answers
    /// with their expected reports, `build.sh`, and `test.sh`, which builds the plugin
    /// and runs `inlet plugin test` over every sample (exit 1 on any difference).
    /// Refuses a folder that is not empty.
    New {
        /// The plugin's name (lower-case letters, digits, dashes): the package and
        /// `.wasm` file take it, dashes as underscores.
        name: String,
        #[arg(long, value_enum)]
        lang: crate::plugin_new::Lang,
        /// Where to write the project (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the WIT package of the plugin contract this host speaks, byte for byte
    /// what it checks plugins against; with --out, write each supported version to
    /// DIR/VERSION/plugin.wit.
    Wit {
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Print the plugin contract versions this host supports, one per line.
    Contract,
    /// Run stored entries of a route through a candidate plugin and the route's own
    /// plugin with the same inputs, and report where their answers differ: each
    /// entry's message through decode, its event through render, each recorded target
    /// answer (its status) through classify. Nothing is sent, no entry changes.
    Replay {
        /// The route whose entries to replay (of `--config`).
        route: String,
        /// The candidate plugin component (`.wasm`).
        #[arg(long, value_name = "FILE")]
        candidate: PathBuf,
        /// Only entries received within this long, e.g. `24h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<Duration>,
        /// The newest this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// The shadow report of a route's candidate from a running instance: answers
    /// compared and differing by call and part, faults, dropped work, recent samples.
    /// Reads the admin API (the token, if it needs one, from INLET_TOKEN).
    Shadow {
        route: String,
        /// The instance's admin API (default: `[admin] listen`, else `[server] listen`).
        #[arg(long, value_name = "URL", env = "INLET_ADMIN_URL")]
        admin_url: Option<String>,
    },
    /// Make the route's candidate its plugin: the routing file is rewritten (the
    /// candidate becomes `plugin`, the version it replaces `previous`) after the
    /// candidate is checked to load; running instances apply it at their next reload.
    /// Recorded in the audit log.
    Promote { route: String },
    /// Undo the last promotion: `previous` serves again and the version it replaced
    /// goes back to being the candidate. Recorded in the audit log.
    Rollback { route: String },
}

fn parse_attribute(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("`{s}` is not NAME=VALUE"))
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Each route: paused or not (since when, by whom, why) and its unresolved entries.
    List,
    /// Stop claiming the route's entries on every instance (within their poll
    /// interval; attempts in flight finish). Pushes and pulls go on filling the inbox.
    Pause {
        /// The route's name.
        name: String,
        /// Why, for the colleague who finds it paused (kept with the pause and in the
        /// audit log).
        #[arg(long)]
        reason: String,
    },
    /// Claim the route's entries again.
    Resume {
        /// The route's name.
        name: String,
    },
    /// Open a replay window: until it closes, a redelivery of a message published
    /// from --from to --to whose entry is already in the inbox is stored once more as
    /// a new entry (and delivered again) instead of dropped as a duplicate. Then seek
    /// the subscription back (`inlet pubsub seek --to FROM`). docs/pubsub.md, "Replay".
    Replay {
        /// The route's name.
        name: String,
        /// Publish times from this one (inclusive), RFC 3339.
        #[arg(long, value_name = "TIME", value_parser = crate::pubsub_client::parse_time)]
        from: std::time::SystemTime,
        /// Publish times up to this one (exclusive), RFC 3339.
        #[arg(long, value_name = "TIME", value_parser = crate::pubsub_client::parse_time)]
        to: std::time::SystemTime,
        /// How long redeliveries are taken (at most 7 days); after that they are
        /// duplicates again.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        open_for: Duration,
        /// Why (kept with the window and in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Replay windows, oldest first, with the entries each has stored; with
    /// --window, that window's entries and the entries they were made from.
    Replays {
        /// Only this route's windows.
        name: Option<String>,
        #[arg(long, value_name = "ID")]
        window: Option<i64>,
    },
    /// Close a replay window before its time: redeliveries are duplicates again.
    ReplayClose {
        /// The window's id.
        id: i64,
    },
}

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// List entries. Without --status or --after: what needs attention first (PARKED,
    /// then OPEN, then IN_PROGRESS, then finished ones), newest first within each, and
    /// how many more there are. With --status or --after: oldest first, for paging.
    List {
        /// Only entries of this route.
        #[arg(long)]
        route: Option<String>,
        /// Only entries in this state: open, in-progress, done, parked or ignored.
        #[arg(long)]
        status: Option<Status>,
        /// Only entries with this correlation key.
        #[arg(long)]
        key: Option<String>,
        /// Only entries with an id above this (oldest first; the next page after the
        /// last id shown).
        #[arg(long)]
        after: Option<i64>,
        /// How many entries to show at most.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one entry in full, with its attempt history.
    Show {
        /// The entry's id.
        id: i64,
    },
    /// Parked and retrying entries grouped by route and error (numbers, ids and
    /// quoted values masked), largest group first: where to start on a bad night.
    Failures {
        /// Only this route.
        #[arg(long)]
        route: Option<String>,
        /// At most this many groups.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Make PARKED entries due again (attempts start over). Entries parked before
    /// decoding are decoded again with the plugin as it is now.
    Requeue {
        /// The entries' ids.
        ids: Vec<i64>,
        /// Requeue every PARKED entry of this route instead.
        #[arg(long, conflicts_with = "ids", value_name = "ROUTE")]
        all_parked: Option<String>,
    },
    /// Park an OPEN entry by hand.
    Park {
        /// The entry's id.
        id: i64,
        /// Why, for whoever looks at it next (kept in the entry and the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Discard PARKED entries with a reason: they become IGNORED (kept until retention
    /// deletes them, the reason and the parking error in their last error) and no
    /// longer hold back later entries of their key. Recorded in the audit log.
    Ignore {
        /// The entries' ids.
        #[arg(required = true)]
        ids: Vec<i64>,
        /// Why they are discarded, for whoever asks later.
        #[arg(long)]
        reason: String,
    },
    /// Delete DONE and IGNORED entries finished longer ago than this. Never PARKED ones.
    Purge {
        /// A duration: `30m`, `12h`, `7d`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
    /// Requeue or park every entry matching a filter, as a job a running Inlet
    /// carries out at `--rate` entries per second (oldest first, so per-key order
    /// holds); `--dry-run` only counts them and names their keys.
    Repair {
        /// requeue (PARKED entries; with --now also OPEN ones waiting for a retry),
        /// park (OPEN entries) or ignore (PARKED entries); park and ignore need --reason.
        #[arg(value_parser = repair_action())]
        action: RepairAction,
        /// Only this route.
        #[arg(long)]
        route: Option<String>,
        /// Only this correlation key.
        #[arg(long)]
        key: Option<String>,
        /// Only this failure group (a fingerprint from `inbox failures`).
        #[arg(long)]
        fingerprint: Option<String>,
        /// Only entries whose last error contains this text.
        #[arg(long)]
        text: Option<String>,
        /// Only entries received longer ago than this (e.g. 1h).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
        /// Only entries received within this (e.g. 30m).
        #[arg(long, value_parser = humantime::parse_duration)]
        newer_than: Option<Duration>,
        /// Requeue OPEN entries waiting for a retry too.
        #[arg(long)]
        now: bool,
        /// Why (required for park; kept with the job for requeue).
        #[arg(long)]
        reason: Option<String>,
        /// Entries per second.
        #[arg(long, default_value_t = crate::operate::jobs::DEFAULT_RATE)]
        rate: u32,
        /// Count and name what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Repair jobs, newest first, with their progress.
    Repairs {
        /// How many jobs to show at most.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Unresolved entries per route and state, with the age of the oldest.
    Stats,
    /// Copy a SQLite inbox into a new FILE while Inlet runs on it: a consistent
    /// snapshot (SQLite's `VACUUM INTO`), checked, flushed to disk, one file. Prints
    /// its entries, size and the time it is consistent as of. Never overwrites a file.
    /// PostgreSQL is refused: use pg_dump (RUNBOOK.md, "Backups and restore").
    Backup {
        /// The backup file to create.
        file: PathBuf,
    },
    /// The audit log: every repair action, who did it, and how it ended.
    Audit {
        /// Only lines with an id above this.
        #[arg(long)]
        after: Option<i64>,
        /// How many lines to show at most.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `inlet run` reports its progress; the tools print their answer, and only
    // warnings and errors besides it.
    let level = if matches!(cli.command, Command::Run { .. }) { "info" } else { "warn" };
    crate::telemetry::init_logging_at(level, cli.log_format);
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: &Path) -> anyhow::Result<Config> {
    Config::load(path).map_err(|errors| anyhow::anyhow!("{errors}"))
}

/// The pull subscriptions `inlet pubsub seek` goes back on: those of the named
/// routes, or of every pull route with `all`.
fn seek_targets(config: &Config, routes: &[String], all: bool) -> anyhow::Result<Vec<String>> {
    use crate::config::SourceConfig;
    let mut names = Vec::new();
    for name in routes {
        let route = config
            .routes
            .iter()
            .find(|r| r.name.as_str() == name)
            .ok_or_else(|| anyhow::anyhow!("no route {name} in {}", config.path.display()))?;
        match &route.source {
            // Routes that share a subscription (content routing) seek it once.
            SourceConfig::Pubsub(s) if names.contains(&s.subscription) => {}
            SourceConfig::Pubsub(s) => names.push(s.subscription.clone()),
            SourceConfig::Push(_) => anyhow::bail!(
                "route {name} is a push route: its routing file does not name the subscription, so seek it with --subscription projects/P/subscriptions/S"
            ),
            SourceConfig::Outbox(_) => anyhow::bail!(
                "route {name} reads an outbox table, not a subscription: there is nothing to seek (its unpublished rows are read again by themselves)"
            ),
        }
    }
    if all {
        for route in &config.routes {
            if let SourceConfig::Pubsub(s) = &route.source
                && !names.contains(&s.subscription)
            {
                names.push(s.subscription.clone());
            }
        }
    }
    Ok(names)
}

/// The routing file a command works on: its own argument, else `--config` (or
/// `INLET_CONFIG`).
fn routing_file(own: Option<PathBuf>, global: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    own.or_else(|| global.clone())
        .ok_or_else(|| anyhow::anyhow!("no routing file: pass --config FILE (or set INLET_CONFIG)"))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let out = Output { json: cli.json };
    match cli.command {
        Command::Run {
            routing,
            listen,
            instance,
            poll,
            retention,
            plugin_cache,
            drain_delay,
            grace,
            ack_journal,
            migrate,
            lock_timeout,
        } => {
            let path = routing_file(routing, &cli.config)?;
            let config = Config::load_partial(&path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
            let mut options = app::Options {
                listen,
                poll,
                retention,
                drain_delay,
                grace,
                ack_journal,
                migrate,
                lock_timeout,
                ..app::Options::default()
            };
            match plugin_cache {
                Some(p) if p.as_os_str() == "off" => options.plugin_cache = None,
                Some(p) => options.plugin_cache = Some(p),
                None => {}
            }
            if let Some(owner) = instance {
                options.owner = owner;
            }
            // The signals first: a stop that comes while Inlet starts (a migration
            // waiting for its lock) ends the start; one right after it drains.
            let mut signals = app::Signals::install();
            let running = tokio::select! {
                running = app::start(&config, options) => running?,
                signal = signals.next() => {
                    tracing::info!(signal, "stopped while starting; nothing was served");
                    return Ok(ExitCode::SUCCESS);
                }
            };
            running.run_until_signal(signals).await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { routing } => check(&routing_file(routing, &cli.config)?),
        Command::Migrate { routing, dry_run, lock_timeout } => {
            let store = store_config(&routing_file(routing, &cli.config)?)?;
            schema::migrate(&store.url, dry_run, lock_timeout, out).await
        }
        Command::Schema { command: SchemaCommand::Status } => {
            let store = store_config(&routing_file(None, &cli.config)?)?;
            schema::status(&store.url, out).await
        }
        Command::Pubsub { command: PubsubCommand::Setup { routing } } => {
            let config = load_config(&routing_file(routing, &cli.config)?)?;
            let connection = Connection::from_env();
            if !out.json {
                println!("pubsub: {}", connection.describe());
            }
            match crate::pubsub_client::setup(&config, &connection).await {
                Ok(steps) => {
                    let answer = serde_json::json!({
                        "pubsub": connection.describe(),
                        "steps": steps.iter().map(|s| s.to_json()).collect::<Vec<_>>(),
                    });
                    out.show(&answer, || {
                        for step in &steps {
                            println!("{step}");
                        }
                        if steps.is_empty() {
                            println!("no pubsub source or target in {}", config.path.display());
                        }
                    })?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Pubsub { command: PubsubCommand::Seek { routes, subscriptions, all, to, margin } } => {
            let mut names = Vec::new();
            if all || !routes.is_empty() {
                let config = load_config(&routing_file(None, &cli.config)?)?;
                names.extend(seek_targets(&config, &routes, all)?);
            }
            names.extend(subscriptions);
            let to = to.checked_sub(margin).ok_or_else(|| anyhow::anyhow!("--margin reaches before 1970"))?;
            let connection = Connection::from_env();
            if !out.json {
                println!("pubsub: {}", connection.describe());
            }
            let admin = connection.subscription_admin().await.map_err(anyhow::Error::msg)?;
            let mut failed = false;
            for name in &names {
                match crate::pubsub_client::seek(&admin, name, to).await {
                    // One JSON object per subscription sought, or its sentence.
                    Ok(done) => out.show_line(&done, &done.to_string())?,
                    Err(e) => {
                        eprintln!("error: {e}");
                        failed = true;
                    }
                }
            }
            Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        Command::Plugin {
            command: PluginCommand::Test { plugin, route, message, attributes, message_id, responses },
        } => {
            let config = match &route {
                Some(_) => Some(
                    Config::load_partial(&routing_file(None, &cli.config)?)
                        .map_err(|errors| anyhow::anyhow!("{errors}"))?,
                ),
                None => None,
            };
            let route = match (&route, &config) {
                (Some(name), Some(config)) => Some(plugin_test_route(config, name)?),
                _ => None,
            };
            let plugin = plugin
                .or_else(|| route.map(|r| r.plugin.clone()))
                .ok_or_else(|| anyhow::anyhow!("name the plugin file, or a route with --route NAME"))?;
            let message =
                std::fs::read(&message).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", message.display()))?;
            let mut parsed = Vec::new();
            for p in &responses {
                let text =
                    std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
                parsed.push(serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?);
            }
            let input = crate::plugin_dev::TestInput {
                plugin: &plugin,
                message,
                attributes,
                message_id,
                responses: parsed,
                limits: route.map_or_else(crate::config::PluginLimits::default, |r| r.limits.clone()),
                route,
            };
            let report = crate::plugin_dev::run(input).await.map_err(|e| anyhow::anyhow!(e))?;
            out.show(&report, || print!("{}", report.text()))?;
            Ok(if report.failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        Command::Plugin { command: PluginCommand::Digest { files } } => plugin_digest(&files, out),
        Command::Plugin { command: PluginCommand::New { name, lang, dir } } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let written = crate::plugin_new::create(&name, lang, &dir).map_err(|e| anyhow::anyhow!(e))?;
            let answer = serde_json::json!({ "name": name, "dir": dir, "files": written });
            out.show(&answer, || {
                println!("wrote {} files into {}:", written.len(), dir.display());
                for f in &written {
                    println!("  {f}");
                }
                println!("next: cd {} && ./test.sh   (builds the plugin and tests every sample)", dir.display());
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Wit { out: dir } } => {
            match dir {
                Some(dir) => {
                    let written = crate::plugin_new::write_wit(&dir).map_err(|e| anyhow::anyhow!(e))?;
                    out.show(&written, || {
                        for f in &written {
                            println!("{}", f.display());
                        }
                    })?;
                }
                None => {
                    use std::io::Write as _;
                    let contract = crate::plugin::CONTRACTS.last().expect("the host supports a contract");
                    std::io::stdout().write_all(contract.wit.as_bytes())?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Contract } => {
            let contracts = crate::plugin::CONTRACTS;
            out.show(&contracts, || {
                for c in contracts {
                    println!("{}", c.package);
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Replay { route, candidate, since, limit } } => {
            let path = routing_file(None, &cli.config)?;
            let store = open_store(&cli.config).await?;
            rollout::replay(&path, store, &route, &candidate, since, limit, out).await
        }
        Command::Plugin { command: PluginCommand::Shadow { route, admin_url } } => {
            // The routing file is read only to find the admin listener.
            let base = match admin_url {
                Some(url) => url,
                None => rollout::admin_url(&routing_file(None, &cli.config)?)?,
            };
            rollout::shadow(&base, &route, out).await
        }
        Command::Plugin { command: PluginCommand::Promote { route } } => {
            let store = open_store(&cli.config).await?;
            rollout::step(&routing_file(None, &cli.config)?, store, &route, crate::config::edit::Step::Promote, out)
                .await
        }
        Command::Plugin { command: PluginCommand::Rollback { route } } => {
            let store = open_store(&cli.config).await?;
            rollout::step(&routing_file(None, &cli.config)?, store, &route, crate::config::edit::Step::Rollback, out)
                .await
        }
        Command::Inbox { command: InboxCommand::Backup { file } } => {
            // Not through `open_store`: that would create (and migrate) a missing
            // inbox, and opens a pool where one connection does.
            let path = routing_file(None, &cli.config)?;
            let store = crate::config::load_store(&path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
            let backup = inbox::backup::backup(&store.url, &file).await?;
            out.show(&backup, || {
                println!(
                    "backed up {} to {}: {} entries, {}; holds everything committed before {}",
                    backup.source.display(),
                    backup.file.display(),
                    view::count(backup.entries.max(0) as u64),
                    view::size(backup.bytes),
                    view::date_millis(backup.consistent_at),
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inbox { command } => {
            let store = open_store(&cli.config).await?;
            inbox_command(store, command, out).await
        }
        Command::Route { command } => {
            let path = routing_file(None, &cli.config)?;
            let declared = crate::config::route_names(&path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
            let store = open_store(&cli.config).await?;
            route_command(store, &declared, &path, command, out).await
        }
    }
}

/// `inlet plugin digest`: the SHA-256 of each file, as a route pins it, in
/// `sha256sum`'s layout (or `--json`: `[{"file", "sha256"}]`). Exit 1 if a file
/// cannot be read; the others are still printed.
fn plugin_digest(files: &[PathBuf], out: Output) -> anyhow::Result<ExitCode> {
    #[derive(serde::Serialize)]
    struct Digest {
        file: String,
        sha256: String,
    }
    let mut digests = Vec::new();
    let mut failed = false;
    for file in files {
        match std::fs::read(file) {
            Ok(bytes) => {
                digests.push(Digest { file: file.display().to_string(), sha256: crate::inbox::digest_hex(&bytes) })
            }
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", file.display());
                failed = true;
            }
        }
    }
    out.show(&digests, || {
        for d in &digests {
            println!("{}  {}", d.sha256, d.file);
        }
    })?;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The route `inlet plugin test --route` takes its plugin, limits and rules from.
fn plugin_test_route<'c>(config: &'c Config, name: &str) -> anyhow::Result<&'c crate::config::RouteConfig> {
    if let Some(route) = config.route(name) {
        return Ok(route);
    }
    if let Some(refused) = config.refused.iter().find(|r| r.name.as_ref().is_some_and(|n| n.as_str() == name)) {
        anyhow::bail!("route `{name}` does not load:\n{}", refused.errors);
    }
    let known: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    anyhow::bail!("no route `{name}` in {} (routes: {})", config.path.display(), known.join(", "))
}

/// The `[store]` of a routing file (or directory), alone.
fn store_config(path: &Path) -> anyhow::Result<crate::config::StoreConfig> {
    crate::config::load_store(path).map_err(|errors| anyhow::anyhow!("{errors}"))
}

/// The inbox of `--config`, read from its `[store]` alone, for a command that reads or
/// repairs entries: never migrated, never created (a missing SQLite file, a schema older
/// or newer than this binary's: refused, nothing changed).
async fn open_store(config: &Option<PathBuf>) -> anyhow::Result<Arc<dyn Store>> {
    let store = store_config(&routing_file(None, config)?)?;
    Ok(inbox::open_as(&store.url, 2, inbox::MigrateMode::Check, inbox::schema::DEFAULT_LOCK_TIMEOUT).await?)
}

/// Where the answer goes: tables for people, or JSON.
#[derive(Debug, Clone, Copy)]
struct Output {
    json: bool,
}

impl Output {
    /// Prints `value` as one JSON document (pretty) or hands over to `table`.
    fn show<T: serde::Serialize>(self, value: &T, table: impl FnOnce()) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            table();
        }
        Ok(())
    }

    /// Reports an action on a route: one JSON object, or a sentence.
    fn show_line<T: serde::Serialize>(self, answer: &T, sentence: &str) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(answer)?);
        } else {
            println!("{sentence}");
        }
        Ok(())
    }

    /// Reports a repair that was done: one JSON object per line, or a sentence.
    fn repaired(self, answer: &Repaired, sentence: &str) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(answer)?);
        } else {
            println!("{sentence}");
        }
        Ok(())
    }
}

/// `inlet check`: every configuration error and every plugin that does not load, each
/// route's once, then a summary naming the refused routes.
fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let config = match Config::load_partial(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut refused: Vec<String> = Vec::new();
    for (i, r) in config.refused.iter().enumerate() {
        // A file that does not parse refuses each route it names with the same errors.
        if i == 0 || config.refused[i - 1].errors != r.errors {
            eprintln!("{}", r.errors);
        }
        refused
            .push(r.name.as_ref().map_or_else(|| format!("(the routes of {})", r.file.display()), |n| n.to_string()));
    }
    let clients = Clients::new(Connection::from_env());
    let loadable = Config { refused: Vec::new(), ..config.clone() };
    let metrics = std::sync::Arc::new(crate::telemetry::Metrics::new());
    let routes = Routes::load(&loadable, crate::plugin::default_cache_dir().as_deref(), clients, metrics);
    for p in routes.problems() {
        let route = p.route.as_deref().unwrap_or_default();
        eprintln!("error: {}: route `{route}`: {}", p.file.display(), p.error);
        refused.push(route.to_string());
    }
    refused.dedup();
    if !refused.is_empty() {
        let total = routes.iter().count() + refused.len();
        eprintln!("error: {} of {total} routes refused: {}", refused.len(), refused.join(", "));
        return Ok(ExitCode::FAILURE);
    }
    for warning in config.access_warnings() {
        eprintln!("warning: {}: {warning}", path.display());
    }
    // A candidate that does not load never stops its route, so it is not an error
    // here either; but it is a mistake to catch before it is shipped.
    for route in routes.iter() {
        if let Some(report) = route.shadow_report().filter(|r| r.state != "running") {
            let why = report.refused.as_deref().unwrap_or("it does not load");
            eprintln!(
                "warning: {}: route `{}`: candidate {} is refused, the route serves without it: {why}",
                route.config.file.display(),
                route.name(),
                report.candidate
            );
        }
    }
    let store = crate::redact::url(&config.store.url);
    println!("{}: ok ({} routes, store {store})", path.display(), config.routes.len());
    Ok(ExitCode::SUCCESS)
}

async fn inbox_command(store: Arc<dyn Store>, command: InboxCommand, out: Output) -> anyhow::Result<ExitCode> {
    let clock = DbClock::new(store.as_ref()).await?;
    match command {
        InboxCommand::List { route, status, key, after, limit } => {
            let filter = ListFilter {
                route,
                status,
                correlation_key: key,
                after_id: after,
                limit,
                newest_first: false,
                ..Default::default()
            };
            let listing = if status.is_none() && after.is_none() {
                attention_first(store.as_ref(), &filter).await?
            } else {
                oldest_first(store.as_ref(), &filter).await?
            };
            out.show(&listing, || print_listing(&listing))?;
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Show { id } => {
            let entry = store.get(id).await?.ok_or_else(|| anyhow::anyhow!("no entry {id}"))?;
            let attempts = store.attempts(id).await?;
            let mut shown = crate::admin::entry_view(&entry);
            shown.attempts = Some(attempts.clone());
            out.show(&shown, || {
                print!("{}", view::entry_detail(&entry));
                print_attempts(&attempts);
            })?;
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Failures { route, limit } => {
            let groups = store.failure_groups(route.as_deref(), limit).await?;
            out.show(&groups, || {
                println!(
                    "{:<24}  {:>7}  {:>8}  {:>5}  {:>8}  ERROR (fingerprint)",
                    "ROUTE", "PARKED", "RETRYING", "KEYS", "EXAMPLE"
                );
                for g in &groups {
                    println!(
                        "{:<24}  {:>7}  {:>8}  {:>5}  {:>8}  {}",
                        g.route, g.parked, g.retrying, g.keys, g.example_id, g.fingerprint
                    );
                }
                if groups.is_empty() {
                    println!("(nothing parked or retrying)");
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Requeue { ids, all_parked } => {
            let ids = match all_parked {
                Some(route) => all_parked_ids(store.as_ref(), &route).await?,
                None => ids,
            };
            if ids.is_empty() {
                anyhow::bail!("nothing to requeue: name entry ids, or --all-parked ROUTE with parked entries");
            }
            repair_each(&operator(store.as_ref(), &clock), &ids, EntryRepair::Requeue, out).await
        }
        InboxCommand::Park { id, reason } => {
            let reason = Reason::new(&reason, Inputs::Flags)?;
            repair_each(&operator(store.as_ref(), &clock), &[id], EntryRepair::Park(reason), out).await
        }
        InboxCommand::Ignore { ids, reason } => {
            let reason = Reason::new(&reason, Inputs::Flags)?;
            repair_each(&operator(store.as_ref(), &clock), &ids, EntryRepair::Ignore(reason), out).await
        }
        InboxCommand::Purge { older_than } => {
            let asked = humantime::format_duration(older_than).to_string();
            let answer = operator(store.as_ref(), &clock).purge(older_than, &asked).await?;
            out.show(&answer, || println!("purged {} finished entries", answer.purged))?;
            Ok(ExitCode::SUCCESS)
        }
        // Answered in `run`, before an inbox is opened (opening creates a missing one).
        InboxCommand::Backup { .. } => unreachable!("inbox backup opens no store"),
        InboxCommand::Audit { after, limit } => {
            let audit = store.list_audit(after, limit).await?;
            let next_after = (audit.len() == limit as usize).then(|| audit.last().map(|a| a.id)).flatten();
            let page = AuditPage { audit, next_after };
            out.show(&page, || {
                println!("{}", view::audit_header());
                for a in &page.audit {
                    println!("{}", view::audit_line(a));
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Repair {
            action,
            route,
            key,
            fingerprint,
            text,
            older_than,
            newer_than,
            now,
            reason,
            rate,
            dry_run,
        } => {
            use crate::inbox::repair::RepairFilter;
            let plan = JobPlan::new(action, reason.as_deref(), rate, Inputs::Flags)?;
            let at = clock.now();
            let ago = |d: Duration| crate::clock::ago(at, d);
            let filter = RepairFilter {
                route,
                key,
                fingerprint,
                text,
                received_before: older_than.map(ago),
                received_after: newer_than.map(ago),
                now,
            };
            let matches = crate::operate::jobs::dry_run(store.as_ref(), action, &filter).await?;
            let keys = if matches.distinct_keys > matches.keys.len() {
                format!("{} … ({} keys)", matches.keys.join(", "), matches.distinct_keys)
            } else {
                matches.keys.join(", ")
            };
            if dry_run {
                println!("{} entries would be {}: {}", matches.count, action.past(), filter.describe());
                println!("keys: {keys}");
                return Ok(ExitCode::SUCCESS);
            }
            if matches.count == 0 {
                eprintln!("error: nothing matches {}", filter.describe());
                return Ok(ExitCode::FAILURE);
            }
            let job = operator(store.as_ref(), &clock).start_job(&plan, &filter, &matches).await?;
            println!(
                "job {job}: {} entries to {} at {rate}/s; a running Inlet carries it out (see `inlet inbox repairs`)",
                matches.count,
                action.as_str()
            );
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Repairs { limit } => {
            println!(
                "{:>5}  {:<8}  {:<8}  {:>11}  {:>6}  {:<20}  FILTER",
                "JOB", "ACTION", "STATE", "MOVED/TOTAL", "RATE", "BY"
            );
            for j in store.list_repair_jobs(limit).await? {
                println!(
                    "{:>5}  {:<8}  {:<8}  {:>11}  {:>6}  {:<20}  {}",
                    j.id,
                    j.action.as_str(),
                    j.state,
                    format!("{}/{}", j.moved, j.total),
                    j.rate,
                    j.actor,
                    j.filter.describe()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Stats => {
            let now = clock.now();
            let counts = Stats { counts: store.counts().await? };
            out.show(&counts, || {
                println!("{}", view::stats_header());
                for c in &counts.counts {
                    println!("{}", view::stats_line(c, now));
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A repair action as the command line names it: the stored names, offered by clap
/// as the possible values.
fn repair_action() -> impl clap::builder::TypedValueParser<Value = RepairAction> {
    use clap::builder::TypedValueParser as _;
    let names = [RepairAction::Requeue, RepairAction::Park, RepairAction::Ignore].map(RepairAction::as_str);
    clap::builder::PossibleValuesParser::new(names)
        .map(|name| RepairAction::parse(&name).expect("clap offers only the actions' names"))
}

async fn route_command(
    store: Arc<dyn Store>,
    declared: &[String],
    path: &Path,
    command: RouteCommand,
    out: Output,
) -> anyhow::Result<ExitCode> {
    let clock = DbClock::new(store.as_ref()).await?;
    let unknown = |name: &str| {
        anyhow::anyhow!("no route named `{name}` in {} (its routes: {})", path.display(), declared.join(", "))
    };
    match command {
        RouteCommand::List => {
            let list = route_list(store.as_ref(), declared).await?;
            out.show(&list, || print_routes(&list))?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Pause { name, reason } => {
            if !declared.contains(&name) {
                return Err(unknown(&name));
            }
            let reason = Reason::new(&reason, Inputs::Flags)?;
            let answer = operator(store.as_ref(), &clock).pause(&name, reason).await?;
            out.show_line(
                &answer,
                &format!("paused {name}: no instance claims its entries until `inlet route resume {name}`"),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Replay { name, from, to, open_for, reason } => {
            if !declared.contains(&name) {
                return Err(unknown(&name));
            }
            let reason = Reason::new(&reason, Inputs::Flags)?;
            let published = crate::clock::millis_of(from)..crate::clock::millis_of(to);
            let window = operator(store.as_ref(), &clock).open_replay(&name, published, open_for, reason).await?;
            out.show_line(
                &window,
                &format!(
                    "opened replay window {id} on {name}: a message published from {from} to {to} that comes again \
                     before {until} is stored as a new entry, once; now bring the messages back with \
                     `inlet pubsub seek --route {name} --to {from}` (or the push subscription's seek)",
                    id = window.id,
                    from = view::date_millis(window.published_from),
                    to = view::date_millis(window.published_to),
                    until = view::date_millis(window.closes_at),
                ),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Replays { name, window: Some(id) } => {
            let window = store.replay_window(id).await?.filter(|w| name.as_ref().is_none_or(|n| *n == w.route));
            let Some(window) = window else {
                anyhow::bail!("no replay window {id}{}", name.map(|n| format!(" on route {n}")).unwrap_or_default());
            };
            let answer = crate::operate::ReplayEntries::of(store.as_ref(), window).await?;
            out.show(&answer, || {
                println!("{}", view::replay_line(&answer.window, clock.now()));
                println!("{:>10}  {:>10}", "ENTRY", "FROM");
                for m in &answer.entries {
                    println!("{:>10}  {:>10}", m.entry, m.original);
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Replays { name, window: None } => {
            let windows = store.replay_windows(name.as_deref(), None).await?;
            let now = clock.now();
            out.show(&windows, || {
                for w in &windows {
                    println!("{}", view::replay_line(w, now));
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::ReplayClose { id } => {
            let window = operator(store.as_ref(), &clock).close_replay(id).await?;
            out.show_line(
                &window,
                &format!("closed replay window {id} on {}: it stored {} entries", window.route, window.taken),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        RouteCommand::Resume { name } => {
            // A route no longer in the routing files may still be paused in the inbox
            // (`route list` shows it): it is resumed all the same.
            let answer = match operator(store.as_ref(), &clock).resume(&name).await {
                Ok(answer) => answer,
                Err(Refusal::NotPaused(_)) if !declared.contains(&name) => return Err(unknown(&name)),
                Err(refused) => return Err(refused.into()),
            };
            out.show_line(&answer, &format!("resumed {name}"))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `route list`: one row per route the routing files declare, the inbox holds
/// unresolved entries of, or that is paused.
#[derive(Debug, serde::Serialize)]
struct RouteRows {
    routes: Vec<RouteRow>,
}

#[derive(Debug, serde::Serialize)]
struct RouteRow {
    name: String,
    /// Whether the routing files name it.
    declared: bool,
    paused: Option<PauseView>,
    /// Unresolved entries by state.
    unresolved: std::collections::BTreeMap<&'static str, i64>,
}

async fn route_list(store: &dyn Store, declared: &[String]) -> anyhow::Result<RouteRows> {
    let counts = store.counts().await?;
    let mut paused: std::collections::BTreeMap<String, PauseView> =
        store.paused_routes(None).await?.into_iter().map(|p| (p.route.clone(), p.into())).collect();
    let mut names: std::collections::BTreeSet<String> = declared.iter().cloned().collect();
    names.extend(counts.iter().map(|c| c.route.clone()));
    names.extend(paused.keys().cloned());
    let routes = names
        .into_iter()
        .map(|name| {
            let unresolved = [Status::Open, Status::InProgress, Status::Parked]
                .into_iter()
                .map(|s| (s.as_str(), counts.iter().find(|c| c.route == name && c.status == s).map_or(0, |c| c.count)))
                .collect();
            RouteRow { declared: declared.contains(&name), paused: paused.remove(&name), unresolved, name }
        })
        .collect();
    Ok(RouteRows { routes })
}

fn print_routes(list: &RouteRows) {
    println!("{}", view::route_header());
    for r in &list.routes {
        let paused = r.paused.as_ref().map(PauseView::sentence);
        let name = if r.declared { r.name.clone() } else { format!("{} (not in the routing files)", r.name) };
        println!("{}", view::route_line(&name, &r.unresolved, paused.as_deref()));
    }
}

/// `inbox stats --json`.
#[derive(Debug, serde::Serialize)]
struct Stats {
    counts: Vec<inbox::RouteStatusCount>,
}

/// `inbox list`: the entries shown, how many match in all (per state, when listed
/// by attention), and how many are not shown.
#[derive(Debug, serde::Serialize)]
struct Listing {
    entries: Vec<crate::admin::answer::EntryView>,
    /// How the entries are ordered: `attention` or `oldest_first`.
    order: &'static str,
    /// Entries the filter matches, shown or not.
    matching: u64,
    /// Matching entries not shown.
    more: u64,
    /// Matching entries per state (`attention` order only).
    #[serde(skip_serializing_if = "Option::is_none")]
    by_status: Option<std::collections::BTreeMap<&'static str, u64>>,
}

/// The states in the order `inbox list` shows them: what needs a person, what waits
/// for the relay, what is in flight, then what is finished.
const ATTENTION: [Status; 5] = [Status::Parked, Status::Open, Status::InProgress, Status::Done, Status::Ignored];

/// Entries by [`ATTENTION`], newest first within each state, up to the filter's
/// limit; finished entries (DONE and IGNORED) together, newest first.
async fn attention_first(store: &dyn Store, filter: &ListFilter) -> anyhow::Result<Listing> {
    let mut by_status = std::collections::BTreeMap::new();
    for status in ATTENTION {
        by_status.insert(status.as_str(), store.count(&ListFilter { status: Some(status), ..filter.clone() }).await?);
    }
    let mut entries = Vec::new();
    for group in [&[Status::Parked][..], &[Status::Open], &[Status::InProgress], &[Status::Done, Status::Ignored]] {
        let room = filter.limit as usize - entries.len();
        if room == 0 {
            break;
        }
        let mut found = Vec::new();
        for status in group {
            let page = ListFilter { status: Some(*status), limit: room as u32, newest_first: true, ..filter.clone() };
            found.extend(store.list(&page).await?);
        }
        found.sort_by_key(|e| std::cmp::Reverse(e.id));
        found.truncate(room);
        entries.extend(found);
    }
    let matching: u64 = by_status.values().sum();
    Ok(Listing {
        more: matching.saturating_sub(entries.len() as u64),
        entries: entries.iter().map(crate::admin::entry_view).collect(),
        order: "attention",
        matching,
        by_status: Some(by_status),
    })
}

/// The filter's entries, oldest first (paging with --after).
async fn oldest_first(store: &dyn Store, filter: &ListFilter) -> anyhow::Result<Listing> {
    let entries = store.list(filter).await?;
    let matching = store.count(filter).await?;
    Ok(Listing {
        more: matching.saturating_sub(entries.len() as u64),
        entries: entries.iter().map(crate::admin::entry_view).collect(),
        order: "oldest_first",
        matching,
        by_status: None,
    })
}

fn print_listing(listing: &Listing) {
    if listing.matching == 0 {
        println!("no entries");
        return;
    }
    println!("{}", view::entry_header());
    for e in &listing.entries {
        println!("{}", view::entry_line(&e.entry));
    }
    let shown = listing.entries.len() as u64;
    let mut summary = format!("{} of {} entries", view::count(shown), view::count(listing.matching));
    if let Some(by_status) = &listing.by_status {
        let states: Vec<String> = ATTENTION
            .iter()
            .filter_map(|s| by_status.get(s.as_str()).filter(|n| **n > 0).map(|n| format!("{s} {}", view::count(*n))))
            .collect();
        summary.push_str(&format!(", what needs attention first, newest first ({})", states.join(", ")));
    }
    if listing.more > 0 {
        let hint = match (listing.order, listing.entries.last()) {
            ("oldest_first", Some(last)) => format!("--after {} for the next page", last.entry.id),
            _ => "narrow with --route, --status or --key, or raise --limit".into(),
        };
        summary.push_str(&format!("; {} more: {hint}", view::count(listing.more)));
    }
    println!("{summary}");
}

/// The command line's operator actions: as `cli:<user>`, from outside any instance.
fn operator<'a>(store: &'a dyn Store, clock: &'a DbClock) -> Operator<'a> {
    Operator::new(store, clock, Relays::Elsewhere, cli_actor())
}

/// Repairs each entry of `ids` in turn, printing what was done; a refusal is printed
/// and the others are still tried (exit 1), a store failure stops.
async fn repair_each(ops: &Operator<'_>, ids: &[i64], repair: EntryRepair, out: Output) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for &id in ids {
        match ops.repair(id, &repair).await {
            Ok(done) => out.repaired(&done, &format!("{} {id}", done.action.past()))?,
            Err(Refusal::Store(e)) => return Err(e.into()),
            Err(refused) => {
                eprintln!("error: {refused}");
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The attempt history under `inbox show`, one line per attempt.
fn print_attempts(attempts: &[crate::inbox::failures::Attempt]) {
    if attempts.is_empty() {
        return;
    }
    println!("attempts:");
    for a in attempts {
        let requests: Vec<String> = a
            .requests
            .iter()
            .map(|r| match (r.status, &r.error) {
                (Some(status), _) => format!("{} {} → {status}", r.method, r.path),
                (None, Some(error)) => format!("{} {} → {error}", r.method, r.path),
                (None, None) => format!("{} {}", r.method, r.path),
            })
            .collect();
        println!(
            "  #{} {} {}ms by {}: {} → {}{}  [{}]",
            a.attempt,
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(a.started_at.max(0) as u64)),
            a.duration_ms,
            a.owner,
            a.answer,
            a.status,
            a.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
            requests.join("; ")
        );
    }
}

async fn all_parked_ids(store: &dyn Store, route: &str) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(&ListFilter {
                route: Some(route.to_string()),
                status: Some(Status::Parked),
                after_id: after,
                limit: 1000,
                ..Default::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        ids.extend(page.iter().map(|e| e.id));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `--drain-delay` and `--grace` defaults are written twice (clap's help wants
    /// text, `app::Options` a duration): they must stay the same.
    #[test]
    fn run_defaults_match_the_library_defaults() {
        let cli = Cli::try_parse_from(["inlet", "run", "inlet.toml"]).expect("parses");
        let Command::Run { drain_delay, grace, .. } = cli.command else { panic!("not run: {:?}", cli.command) };
        assert_eq!((drain_delay, grace), (app::DEFAULT_DRAIN_DELAY, app::DEFAULT_GRACE));
    }
}
