//! The `inlet` command line. Output for people goes to stdout; logs go to stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::app;
use crate::clock::{Clock, DbClock};
use crate::config::Config;
use crate::inbox::{self, Entry, ListFilter, NewAudit, Status, Store};
use crate::pubsub::Connection;
use crate::routing::Routes;
use crate::target::Clients;

#[derive(Debug, Parser)]
#[command(
    name = "inlet",
    version,
    about = "Pub/Sub in, transactional inbox, ordered relay out — extended by WebAssembly plugins"
)]
pub struct Cli {
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
        config: PathBuf,
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
        /// On SIGTERM or ctrl-c, how long in-flight deliveries may take to finish.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// Append every Pub/Sub message id Inlet acks to this file, after its row is
        /// committed (`ROUTE<TAB>ID` lines): lets a test or an audit check that
        /// nothing was acked without its row.
        #[arg(long, env = "INLET_ACK_JOURNAL")]
        ack_journal: Option<PathBuf>,
    },
    /// Validate a routing file (or a directory of them) and load its plugins; exit 1
    /// listing every error and every refused route.
    Check { config: PathBuf },
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
    /// Inspect and repair the inbox (works whether or not Inlet is running).
    Inbox {
        /// The routing file (or directory) whose store to open. Only its `[store]` is
        /// read: plugin files and target secrets need not be there.
        #[arg(long, short, env = "INLET_CONFIG")]
        config: PathBuf,
        #[command(subcommand)]
        command: InboxCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum PubsubCommand {
    /// Create the topics and subscriptions a routing file names, where missing:
    /// target topics, source topics, dead-letter topics and subscriptions (ordered
    /// when the route is, with a retry policy and the dead-letter policy if set).
    Setup { config: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run a plugin's decode, render and (with --response) classify on files, and print
    /// what each step produced.
    Test {
        /// The plugin component (`.wasm`).
        plugin: PathBuf,
        /// The message payload, as the broker would deliver it.
        #[arg(long)]
        message: PathBuf,
        /// A broker attribute, `NAME=VALUE`; repeatable.
        #[arg(long = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, String)>,
        #[arg(long, default_value = "test-message-1")]
        message_id: String,
        /// The target's answer as JSON: `{"status": 400, "headers": {…}, "body": …}` or
        /// `{"transport_error": "timeout", "message": "…"}`. Repeat it for each step of
        /// a multi-step exchange.
        #[arg(long = "response")]
        responses: Vec<PathBuf>,
    },
}

fn parse_attribute(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("`{s}` is not NAME=VALUE"))
}

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// List entries, oldest first.
    List {
        #[arg(long)]
        route: Option<String>,
        /// open, in-progress, done, parked or ignored.
        #[arg(long)]
        status: Option<Status>,
        /// Only entries with this correlation key.
        #[arg(long)]
        key: Option<String>,
        /// Only entries with an id above this.
        #[arg(long)]
        after: Option<i64>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one entry in full, with its attempt history, as JSON.
    Show { id: i64 },
    /// Parked and retrying entries grouped by route and error (numbers, ids and
    /// quoted values masked), largest group first: where to start on a bad night.
    Failures {
        /// Only this route.
        #[arg(long)]
        route: Option<String>,
        /// At most this many groups.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make PARKED entries due again (attempts start over). Entries parked before
    /// decoding are decoded again with the plugin as it is now.
    Requeue {
        ids: Vec<i64>,
        /// Requeue every PARKED entry of this route instead.
        #[arg(long, conflicts_with = "ids")]
        all_parked: Option<String>,
    },
    /// Park an OPEN entry by hand.
    Park {
        id: i64,
        #[arg(long)]
        reason: String,
    },
    /// Delete DONE and IGNORED entries finished longer ago than this. Never PARKED ones.
    Purge {
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
    /// Requeue or park every entry matching a filter, as a job a running Inlet
    /// carries out at `--rate` entries per second (oldest first, so per-key order
    /// holds); `--dry-run` only counts them and names their keys.
    Repair {
        /// requeue (PARKED entries; with --now also OPEN ones waiting for a retry) or
        /// park (OPEN entries; needs --reason).
        #[arg(value_enum)]
        action: RepairActionArg,
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
        #[arg(long, default_value_t = crate::repair::DEFAULT_RATE)]
        rate: u32,
        /// Count and name what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Repair jobs, newest first, with their progress.
    Repairs {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Unresolved entries per route and state.
    Stats,
    /// The audit log: every repair action, who did it, and how it ended.
    Audit {
        /// Only lines with an id above this.
        #[arg(long)]
        after: Option<i64>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::telemetry::init_logging();
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

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, listen, instance, poll, retention, plugin_cache, grace, ack_journal } => {
            let config = Config::load_partial(&config).map_err(|errors| anyhow::anyhow!("{errors}"))?;
            let mut options = app::Options { listen, poll, retention, grace, ack_journal, ..app::Options::default() };
            match plugin_cache {
                Some(p) if p.as_os_str() == "off" => options.plugin_cache = None,
                Some(p) => options.plugin_cache = Some(p),
                None => {}
            }
            if let Some(owner) = instance {
                options.owner = owner;
            }
            let running = app::start(&config, options).await?;
            running.run_until_signal().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { config: path } => check(&path),
        Command::Pubsub { command: PubsubCommand::Setup { config } } => {
            let config = load_config(&config)?;
            let connection = Connection::from_env();
            println!("pubsub: {}", connection.describe());
            match crate::pubsub::setup(&config, &connection).await {
                Ok(steps) => {
                    for step in &steps {
                        println!("{step}");
                    }
                    if steps.is_empty() {
                        println!("no pubsub source or target in {}", config.path.display());
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Plugin { command: PluginCommand::Test { plugin, message, attributes, message_id, responses } } => {
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
                limits: crate::config::PluginLimits::default(),
            };
            match crate::plugin_dev::run(input).await {
                Ok(report) => {
                    print!("{report}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Inbox { config, command } => {
            let store = crate::config::load_store(&config).map_err(|errors| anyhow::anyhow!("{errors}"))?;
            let store = inbox::open(&store.url, 2).await?;
            inbox_command(store, command).await
        }
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
    let routes = Routes::load(&loadable, crate::plugin::default_cache_dir().as_deref(), clients);
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
    let store = crate::redact::url(&config.store.url);
    println!("{}: ok ({} routes, store {store})", path.display(), config.routes.len());
    Ok(ExitCode::SUCCESS)
}

async fn inbox_command(store: Arc<dyn Store>, command: InboxCommand) -> anyhow::Result<ExitCode> {
    let clock = DbClock::new(store.as_ref()).await?;
    match command {
        InboxCommand::List { route, status, key, after, limit } => {
            let entries =
                store.list(&ListFilter { route, status, correlation_key: key, after_id: after, limit }).await?;
            println!("{:>8}  {:<11}  {:<24}  {:<20}  {:>8}  LAST ERROR", "ID", "STATUS", "ROUTE", "KEY", "ATTEMPTS");
            for e in &entries {
                println!("{}", list_line(e));
            }
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Show { id } => match store.get(id).await? {
            Some(e) => {
                let mut view = crate::admin::entry_view(&e);
                view["attempts"] = serde_json::to_value(store.attempts(id).await?)?;
                println!("{}", serde_json::to_string_pretty(&view)?);
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("no entry {id}");
                Ok(ExitCode::FAILURE)
            }
        },
        InboxCommand::Failures { route, limit, json } => {
            let groups = store.failure_groups(route.as_deref(), limit).await?;
            if json {
                for g in &groups {
                    println!("{}", serde_json::to_string(g)?);
                }
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<24}  {:>7}  {:>8}  {:>5}  {:>8}  ERROR (fingerprint)", "ROUTE", "PARKED", "RETRYING", "KEYS", "EXAMPLE");
            for g in &groups {
                println!(
                    "{:<24}  {:>7}  {:>8}  {:>5}  {:>8}  {}",
                    g.route, g.parked, g.retrying, g.keys, g.example_id, g.fingerprint
                );
            }
            if groups.is_empty() {
                println!("(nothing parked or retrying)");
            }
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Requeue { ids, all_parked } => {
            let ids = match all_parked {
                Some(route) => all_parked_ids(store.as_ref(), &route).await?,
                None => ids,
            };
            let mut failed = false;
            for id in ids {
                let done = store.requeue(id, clock.now()).await?;
                if done {
                    println!("requeued {id}");
                } else {
                    eprintln!("entry {id} is missing or not PARKED/OPEN; left as it is");
                    failed = true;
                }
                cli_audit(store.as_ref(), &clock, "requeue", id, done, None).await;
            }
            Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        InboxCommand::Park { id, reason } => {
            let done = store.park(id, &format!("parked by hand: {reason}"), clock.now()).await?;
            cli_audit(store.as_ref(), &clock, "park", id, done, Some(reason)).await;
            if done {
                println!("parked {id}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("entry {id} is missing or not OPEN; left as it is");
                Ok(ExitCode::FAILURE)
            }
        }
        InboxCommand::Purge { older_than } => {
            let before = clock.now() - older_than.as_millis() as i64;
            let total = crate::inbox::purge_all(store.as_ref(), before, 10_000, Duration::ZERO).await?;
            let audit = NewAudit {
                actor: crate::admin::audit::cli_actor(),
                action: "purge".into(),
                route: None,
                subject: format!(
                    "DONE and IGNORED entries finished more than {} ago",
                    humantime::format_duration(older_than)
                ),
                outcome: "ok".into(),
                detail: Some(format!("{total} deleted")),
            };
            crate::admin::audit::record(store.as_ref(), audit, clock.now()).await;
            println!("purged {total} finished entries");
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Audit { after, limit } => {
            println!(
                "{:>6}  {:<24}  {:<20}  {:<10}  {:<20}  {:<9}  SUBJECT",
                "ID", "AT", "ACTOR", "ACTION", "ROUTE", "OUTCOME"
            );
            for a in store.list_audit(after, limit).await? {
                println!(
                    "{:>6}  {:<24}  {:<20}  {:<10}  {:<20}  {:<9}  {}",
                    a.id,
                    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(a.at.max(0) as u64)),
                    a.actor,
                    a.action,
                    a.route.as_deref().unwrap_or("-"),
                    a.outcome,
                    a.subject
                );
            }
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
            use crate::repair::{RepairAction, RepairFilter};
            let action = match action {
                RepairActionArg::Requeue => RepairAction::Requeue,
                RepairActionArg::Park => RepairAction::Park,
            };
            if action == RepairAction::Park && reason.is_none() {
                anyhow::bail!("a park needs --reason");
            }
            if rate == 0 || rate > crate::repair::MAX_RATE {
                anyhow::bail!("--rate must be between 1 and {}", crate::repair::MAX_RATE);
            }
            let at = clock.now();
            let ago = |d: Duration| at - d.as_millis() as i64;
            let filter = RepairFilter {
                route,
                key,
                fingerprint,
                text,
                received_before: older_than.map(ago),
                received_after: newer_than.map(ago),
                now,
            };
            let matches = crate::repair::dry_run(store.as_ref(), action, &filter).await?;
            let keys = if matches.distinct_keys > matches.keys.len() {
                format!("{} … ({} keys)", matches.keys.join(", "), matches.distinct_keys)
            } else {
                matches.keys.join(", ")
            };
            if dry_run {
                println!("{} entries would be {}d: {}", matches.count, action.as_str(), filter.describe());
                println!("keys: {keys}");
                return Ok(ExitCode::SUCCESS);
            }
            if matches.count == 0 {
                eprintln!("error: nothing matches {}", filter.describe());
                return Ok(ExitCode::FAILURE);
            }
            let reason = match action {
                RepairAction::Park => reason.map(|r| format!("parked by hand: {r}")),
                RepairAction::Requeue => reason,
            };
            let actor = crate::admin::audit::cli_actor();
            let job = store.create_repair_job(action, &filter, reason.as_deref(), rate, &actor, matches.count, at).await?;
            let audit = NewAudit {
                actor,
                action: format!("repair-{}", action.as_str()),
                route: filter.route.clone(),
                subject: filter.describe(),
                outcome: "started".into(),
                detail: Some(format!("job {job}: {} matching, at {rate}/s", matches.count)),
            };
            crate::admin::audit::record(store.as_ref(), audit, clock.now()).await;
            println!(
                "job {job}: {} entries to {} at {rate}/s; a running Inlet carries it out (see `inlet inbox repairs`)",
                matches.count,
                action.as_str()
            );
            Ok(ExitCode::SUCCESS)
        }
        InboxCommand::Repairs { limit } => {
            println!("{:>5}  {:<8}  {:<8}  {:>11}  {:>6}  {:<20}  FILTER", "JOB", "ACTION", "STATE", "MOVED/TOTAL", "RATE", "BY");
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
            println!("{:<24}  {:<11}  {:>8}  OLDEST", "ROUTE", "STATUS", "COUNT");
            for c in store.counts().await? {
                let age = c.oldest_received_at.map(|t| {
                    humantime::format_duration(Duration::from_secs(((now - t).max(0) / 1000) as u64)).to_string()
                });
                println!("{:<24}  {:<11}  {:>8}  {}", c.route, c.status.as_str(), c.count, age.unwrap_or_default());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RepairActionArg {
    Requeue,
    Park,
}

/// Records a CLI repair of one entry as `cli:<user>`.
async fn cli_audit(store: &dyn Store, clock: &DbClock, action: &str, id: i64, done: bool, detail: Option<String>) {
    let route = store.get(id).await.ok().flatten().map(|e| e.route);
    let audit = NewAudit {
        actor: crate::admin::audit::cli_actor(),
        action: action.into(),
        route,
        subject: format!("entry {id}"),
        outcome: if done { "ok" } else { "conflict" }.into(),
        detail,
    };
    crate::admin::audit::record(store, audit, clock.now()).await;
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

fn list_line(e: &Entry) -> String {
    let err: String = e.last_error.as_deref().unwrap_or("").chars().take(80).collect();
    format!(
        "{:>8}  {:<11}  {:<24}  {:<20}  {:>8}  {}",
        e.id,
        e.status.as_str(),
        e.route,
        e.correlation_key.as_deref().unwrap_or("-"),
        e.attempts,
        err
    )
}
