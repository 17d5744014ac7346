//! `inlet plugin replay | shadow | promote | rollback`: trying a new plugin version
//! against history and live traffic, then making it serve (or not) — the command
//! line's side of [`crate::replay`], [`crate::shadow`] and [`crate::rollout`].

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::{Output, plugin_test_route};
use crate::clock::Clock;
use crate::config::edit::Step;
use crate::config::{Config, PluginFile};
use crate::inbox::DbClock;
use crate::inbox::Store;
use crate::operate::audit::cli_actor;
use crate::operate::{Operator, Relays};
use crate::shadow::{Counts, Report};

/// `inlet plugin replay`: exit 1 when some answer differed or the candidate faulted.
pub(super) async fn replay(
    path: &Path,
    store: Arc<dyn Store>,
    route: &str,
    candidate: &Path,
    since: Option<Duration>,
    limit: u32,
    out: Output,
) -> anyhow::Result<ExitCode> {
    let config = Config::load_partial(path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rc = plugin_test_route(&config, route)?.clone();
    let cache = crate::plugin::default_cache_dir();
    let serving =
        PluginFile { path: rc.plugin.clone(), shown: rc.plugin_shown.clone(), sha256: rc.plugin_sha256.clone() };
    let candidate = PluginFile { path: candidate.to_path_buf(), shown: candidate.to_path_buf(), sha256: None };
    let limits = rc.limits.clone();
    let (serving, candidate) = tokio::task::spawn_blocking(move || {
        let serving = crate::plugin::load::load_file(&serving, &limits, cache.as_deref(), false).1;
        let candidate = crate::plugin::load::load_file(&candidate, &limits, cache.as_deref(), true).1;
        (serving, candidate)
    })
    .await?;
    let serving = serving.map_err(|e| anyhow::anyhow!("the route's plugin does not load: {e}"))?;
    let candidate = candidate.map_err(|e| anyhow::anyhow!("the candidate does not load: {e}"))?;
    let clock = DbClock::new(store.as_ref()).await?;
    let selection = crate::replay::Selection {
        route: route.to_string(),
        since: since.map(|d| clock.now() - d.as_millis() as i64),
        limit,
    };
    let report = crate::replay::run(store.as_ref(), &serving, &candidate, &selection).await?;
    out.show(&report, || {
        println!(
            "replayed {} entries of route {}: serving {}, candidate {} (nothing sent, no entry changed)",
            report.entries,
            report.route,
            &report.serving_sha256[..12],
            &report.candidate_sha256[..12]
        );
        print_counts(&report.counts);
        const SHOWN: usize = 20;
        if !report.differences.is_empty() {
            println!("differences (entry, call, step: parts):");
            for d in report.differences.iter().take(SHOWN) {
                let step = d.step.map_or(String::new(), |s| format!(" step {s}"));
                println!("  {} {}{step}: {}", d.entry, d.call.as_str(), d.parts.join(", "));
            }
            if report.differences.len() > SHOWN {
                println!("  … and {} more (--json lists every one, with samples)", report.differences.len() - SHOWN);
            }
        }
    })?;
    let faults =
        [&report.counts.decode, &report.counts.render, &report.counts.classify].iter().any(|c| !c.faults.is_empty());
    Ok(if report.differences.is_empty() && !faults { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The admin API of the instance a routing file configures: `[admin] listen`, else
/// `[server] listen`.
pub(super) fn admin_url(path: &Path) -> anyhow::Result<String> {
    let config = Config::load_partial(path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    Ok(format!("http://{}", config.admin.listen.unwrap_or(config.server.listen)))
}

/// The longest answer `inlet plugin shadow` reads: a report holds counts and at most
/// `shadow::SAMPLES` samples of a few KiB a side, far less than this.
const MAX_SHADOW_ANSWER: usize = 8 << 20;
/// How long `inlet plugin shadow` waits for the whole answer.
const SHADOW_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `inlet plugin shadow`: the report of a running instance, through its admin API
/// at `base`.
pub(super) async fn shadow(base: &str, route: &str, out: Output) -> anyhow::Result<ExitCode> {
    let base = base.trim_end_matches('/');
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(SHADOW_ANSWER_TIMEOUT)
        .build()?;
    let mut request = client.get(format!("{base}/api/routes/{route}/shadow"));
    if let Ok(token) = std::env::var("INLET_TOKEN") {
        request = request.bearer_auth(token);
    }
    let mut answer = request.send().await.map_err(|e| anyhow::anyhow!("cannot reach the admin API at {base}: {e}"))?;
    let status = answer.status();
    // Read as far as a report can be long, not as far as the other end goes on.
    let mut bytes = Vec::new();
    while let Some(chunk) =
        answer.chunk().await.map_err(|e| anyhow::anyhow!("reading the answer of {base}: {}", e.without_url()))?
    {
        if bytes.len() + chunk.len() > MAX_SHADOW_ANSWER {
            anyhow::bail!(
                "{base} answered more than {} MiB, more than any shadow report: is it an Inlet admin API?",
                MAX_SHADOW_ANSWER >> 20
            );
        }
        bytes.extend_from_slice(&chunk);
    }
    let body = String::from_utf8_lossy(&bytes).into_owned();
    if !status.is_success() {
        let error = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(body);
        anyhow::bail!("{base} answered {status}: {error}");
    }
    let report: Report = serde_json::from_str(&body)?;
    out.show(&report, || print_shadow(&report))?;
    Ok(ExitCode::SUCCESS)
}

fn print_shadow(r: &Report) {
    println!("route {}: candidate {} ({})", r.route, r.candidate, r.state);
    if let Some(refused) = &r.refused {
        println!("  refused: {refused}");
    }
    if let Some(digest) = &r.candidate_sha256 {
        println!("  sha256 {digest}, compared since {}", super::view::date(r.since));
    }
    print_counts(&r.counts);
    if r.counts.dropped > 0 {
        println!("dropped: {} (the candidate was behind; nothing waited for it)", r.counts.dropped);
    }
    for s in &r.samples {
        let about = match (s.entry, &s.message_id) {
            (Some(entry), _) => format!("entry {entry}"),
            (None, Some(id)) => format!("message {id}"),
            (None, None) => String::new(),
        };
        println!("sample: {} {about}: {}", s.call.as_str(), s.parts.join(", "));
        println!("  serving:   {}", s.serving);
        println!("  candidate: {}", s.candidate);
    }
}

fn print_counts(counts: &Counts) {
    println!("{:<10} {:>9} {:>10} {:>7}  parts", "call", "compared", "differing", "faults");
    for (name, c) in [("decode", &counts.decode), ("render", &counts.render), ("classify", &counts.classify)] {
        let faults: u64 = c.faults.values().sum();
        let parts: Vec<String> = c.parts.iter().map(|(p, n)| format!("{p} {n}")).collect();
        println!("{name:<10} {:>9} {:>10} {faults:>7}  {}", c.compared, c.differing, parts.join(", "));
    }
}

/// `inlet plugin promote | rollback`: the routing file rewritten, the step audited.
pub(super) async fn step(
    path: &Path,
    store: Arc<dyn Store>,
    route: &str,
    step: Step,
    out: Output,
) -> anyhow::Result<ExitCode> {
    let config = Config::load_partial(path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rc = plugin_test_route(&config, route)?.clone();
    let cache = crate::plugin::default_cache_dir();
    let result = tokio::task::spawn_blocking(move || crate::rollout::step(&rc, step, cache.as_deref())).await?;
    let clock = DbClock::new(store.as_ref()).await?;
    let operator = Operator::new(store.as_ref(), clock.as_ref(), Relays::Elsewhere, cli_actor());
    operator.record_rollout(step, route, &result).await;
    let action = match step {
        Step::Promote => "promote",
        Step::Rollback => "rollback",
    };
    let done = result?;
    let sentence = format!(
        "{action}: {} now serves route {route} in {} (it replaced {}); running instances apply it at their next \
         reload (SIGHUP or `POST /api/reload` applies it at once)",
        done.serving,
        done.file.display(),
        done.replaced
    );
    out.show_line(&done, &sentence)?;
    Ok(ExitCode::SUCCESS)
}
