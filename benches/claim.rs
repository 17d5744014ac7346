//! What the per-key lock of the ordered claim costs on PostgreSQL, beside the claim it
//! replaced, measured alternately in one run.
//!
//! ```text
//! cargo bench --bench claim -- [--backlog 10000,100000] [--keys 1000] [--claimers 1,2,4] [--batch 16] [--work 4000]
//! ```
//!
//! For each backlog size, a fresh database (through `INLET_TEST_PG_ADMIN_URL`, dropped
//! at the end) is filled with that many OPEN entries over `--keys` keys. Then, for
//! each number of concurrent claimers, three variants take turns, three rounds each
//! (the median is printed): every round claims and settles (DONE) `--work` entries,
//! `--batch` per claim, then puts them back to OPEN so every round starts from the
//! same backlog.
//!
//! - **locked**: Inlet's ordered claim — a transaction that try-locks the candidates'
//!   keys (`pg_try_advisory_xact_lock`) and then claims, in a new snapshot, only
//!   entries of keys it holds. Safe with many instances.
//! - **snapshot**: the ordered claim the locks replaced — one statement whose "no older
//!   unresolved entry of this key" check reads a snapshot it does not lock. The same
//!   work, without the lock; unsafe with concurrent inserts, requeues or re-decodes.
//! - **unordered**: the claim of a route without per-key order, the floor.
//!
//! Every variant settles through the same store call, so the difference is the claim.
//! Benchmarks print figures; they never assert timings.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use inlet::inbox::{ClaimRequest, Settlement, Store};
use inlet_testkit::pg::TestPg;
use support::Table;

const ROUTE: &str = "bench";
const LEASE_MS: i64 = 60_000;
const ROUNDS: usize = 3;

struct Args {
    backlogs: Vec<usize>,
    keys: usize,
    claimers: Vec<usize>,
    batch: u32,
    work: usize,
}

fn usage() -> &'static str {
    "usage: cargo bench --bench claim -- [--backlog N,N…] [--keys K] [--claimers C,C…] [--batch B] [--work W]"
}

fn parse_args() -> Result<Args, String> {
    let mut args =
        Args { backlogs: vec![10_000, 100_000], keys: 1_000, claimers: vec![1, 2, 4], batch: 16, work: 4_000 };
    let list = |v: &str| -> Result<Vec<usize>, String> {
        v.split(',').map(|n| n.trim().replace('_', "").parse::<usize>().map_err(|e| format!("`{n}`: {e}"))).collect()
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--backlog" => args.backlogs = list(&value)?,
            "--keys" => args.keys = value.parse().map_err(|e| format!("--keys: {e}"))?,
            "--claimers" => args.claimers = list(&value)?,
            "--batch" => args.batch = value.parse().map_err(|e| format!("--batch: {e}"))?,
            "--work" => args.work = value.parse().map_err(|e| format!("--work: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.keys == 0 || args.batch == 0 || args.work == 0 || args.claimers.contains(&0) {
        return Err("--keys, --batch, --work and --claimers must be positive".into());
    }
    Ok(args)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Locked,
    Snapshot,
    Unordered,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Locked, Variant::Snapshot, Variant::Unordered];

    fn name(self) -> &'static str {
        match self {
            Variant::Locked => "locked (Inlet)",
            Variant::Snapshot => "snapshot (before #10)",
            Variant::Unordered => "unordered",
        }
    }
}

/// What one round measured.
struct Round {
    entries: usize,
    elapsed: Duration,
    claim_time: Duration,
    claims: usize,
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("{e}\n{}", usage());
        std::process::exit(2)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let mut table = Table::default();
    for &backlog in &args.backlogs {
        let pg = TestPg::new().await;
        let store = inlet::inbox::open(&pg.url, 16).await.expect("open the store");
        let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
        let started = Instant::now();
        preload(&pool, backlog, args.keys).await;
        eprintln!(
            "backlog of {backlog} entries over {} keys loaded in {:.1}s",
            args.keys,
            started.elapsed().as_secs_f64()
        );
        for &claimers in &args.claimers {
            let mut results: Vec<(Variant, Vec<Round>)> = Variant::ALL.iter().map(|v| (*v, Vec::new())).collect();
            for _ in 0..ROUNDS {
                for (variant, rounds) in results.iter_mut() {
                    rounds.push(round(&store, &pool, *variant, claimers, args.batch, args.work.min(backlog)).await);
                    reset(&pool).await;
                }
            }
            let medians: Vec<(Variant, f64, f64)> = results
                .iter()
                .map(|(variant, rounds)| {
                    let rate = median(rounds.iter().map(|r| r.entries as f64 / r.elapsed.as_secs_f64()).collect());
                    let per_claim = median(
                        rounds.iter().map(|r| r.claim_time.as_secs_f64() * 1e3 / r.claims.max(1) as f64).collect(),
                    );
                    (*variant, rate, per_claim)
                })
                .collect();
            let snapshot = medians.iter().find(|m| m.0 == Variant::Snapshot).map(|m| m.1).unwrap_or(f64::NAN);
            for (variant, rate, per_claim) in medians {
                table.row(
                    "postgres",
                    format!("backlog {backlog}, {claimers} claimer(s), {}", variant.name()),
                    format!("{rate:.0} entries/s  ({:.2}× snapshot, {per_claim:.2} ms per claim)", rate / snapshot),
                );
            }
        }
        pool.close().await;
        drop(store);
    }
    println!(
        "\nclaim + settle on PostgreSQL, median of {ROUNDS} rounds, batch {}, {} entries per round",
        args.batch, args.work
    );
    println!("{}", table.render());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` OPEN entries, entry `i` of key `key-{i % keys}`, ids in key order.
async fn preload(pool: &sqlx::PgPool, n: usize, keys: usize) {
    sqlx::query(
        "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, body, raw_data, attributes,
             message_id, payload_digest, status, next_attempt_at, received_at, updated_at)
         SELECT $1, 'd-' || i, 'key-' || (i % $3), 'work-order-completed',
             convert_to('{\"workOrderId\":\"key-' || (i % $3) || '\",\"completedItems\":' || i || '}', 'UTF8'),
             convert_to('{\"workOrderId\":\"key-' || (i % $3) || '\",\"completedItems\":' || i || '}', 'UTF8'),
             '[]', 'm-' || i, md5(i::text), 'OPEN', 0, 0, 0
         FROM generate_series(0, $2 - 1) AS i",
    )
    .bind(ROUTE)
    .bind(n as i64)
    .bind(keys as i64)
    .execute(pool)
    .await
    .expect("preload the backlog");
    sqlx::query("ANALYZE inbox_entry").execute(pool).await.expect("analyze");
}

/// Puts what a round finished back to OPEN, so the next round sees the same backlog.
async fn reset(pool: &sqlx::PgPool) {
    sqlx::query(
        "UPDATE inbox_entry SET status = 'OPEN', finished_at = NULL, attempts = 0, lease_owner = NULL,
             lease_expires_at = NULL WHERE status <> 'OPEN'",
    )
    .execute(pool)
    .await
    .expect("reset the backlog");
    sqlx::query("VACUUM ANALYZE inbox_entry").execute(pool).await.expect("vacuum");
}

/// `claimers` tasks claim and settle until `work` entries are done between them.
async fn round(
    store: &Arc<dyn Store>,
    pool: &sqlx::PgPool,
    variant: Variant,
    claimers: usize,
    batch: u32,
    work: usize,
) -> Round {
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..claimers {
        let (store, pool, done) = (Arc::clone(store), pool.clone(), Arc::clone(&done));
        tasks.spawn(async move {
            let owner = format!("bench-{c}");
            let (mut claim_time, mut claims, mut idle) = (Duration::ZERO, 0, 0);
            while done.load(std::sync::atomic::Ordering::Relaxed) < work {
                let t = Instant::now();
                let claimed = claim(&store, &pool, variant, &owner, batch).await;
                claim_time += t.elapsed();
                claims += 1;
                if claimed.is_empty() {
                    // Every eligible head is held by another claimer: wait for a settle.
                    idle += 1;
                    assert!(idle < 10_000, "{variant:?}: claimers found nothing to claim for too long");
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                for (id, lease) in claimed {
                    store.settle(id, &lease, 1, &Settlement::Done).await.expect("settle");
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            (claim_time, claims)
        });
    }
    let (mut claim_time, mut claims) = (Duration::ZERO, 0);
    while let Some(r) = tasks.join_next().await {
        let (t, n) = r.expect("claimer task");
        claim_time += t;
        claims += n;
    }
    let elapsed = started.elapsed();
    Round { entries: done.load(std::sync::atomic::Ordering::Relaxed), elapsed, claim_time, claims }
}

async fn claim(
    store: &Arc<dyn Store>,
    pool: &sqlx::PgPool,
    variant: Variant,
    owner: &str,
    batch: u32,
) -> Vec<(i64, inlet::inbox::Lease)> {
    let request = ClaimRequest {
        route: ROUTE,
        owner,
        limit: batch,
        now: 1,
        lease_ms: LEASE_MS,
        ordered: variant != Variant::Unordered,
        parked_blocks: true,
        share: None,
    };
    match variant {
        Variant::Locked | Variant::Unordered => {
            let claimed = store.claim(&request).await.expect("claim");
            claimed.into_iter().map(|c| (c.entry.id, c.lease)).collect()
        }
        Variant::Snapshot => {
            // The single statement of the unordered claim, with the order check on.
            let rows: Vec<(i64, i64)> = sqlx::query_as(inlet::inbox::postgres::CLAIM_SQL_UNLOCKED)
                .bind(request.route)
                .bind(request.now)
                .bind(true)
                .bind(request.parked_blocks)
                .bind(i64::from(request.limit))
                .bind(owner)
                .bind(request.lease_ms)
                .fetch_all(pool)
                .await
                .expect("snapshot claim");
            rows.into_iter()
                .map(|(id, token)| {
                    (id, inlet::inbox::Lease { owner: owner.to_string(), token, expires_at: 1 + LEASE_MS })
                })
                .collect()
        }
    }
}
