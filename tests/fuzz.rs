//! Seedable mutation fuzzing of the two parsers strangers and typos reach
//! first: the routing-file loader (`Config::from_str`, and `Config::load` for bytes
//! that are not UTF-8) and the push-envelope parser (`PushEnvelope::parse`).
//!
//! Each target starts from valid inputs (the routing files in `config/` and
//! `tests/ui/`, a handful of real push envelopes), mutates bytes and tokens, and holds
//! the parser to its contract: it never panics, never hangs, and answers `Ok` or an
//! error that names the place — for the loader the file and a line within it, for
//! the envelope the field.
//!
//! Bounded for CI: 10,000 loader and 40,000 envelope inputs. For a long run:
//!
//! ```sh
//! INLET_FUZZ_SECONDS=600 INLET_FUZZ_SEED=random cargo test --test fuzz -- --nocapture loader
//! INLET_FUZZ_ITERATIONS=5000000 INLET_FUZZ_SEED=42 cargo test --test fuzz -- --nocapture envelope
//! ```
//!
//! Long runs on this code (debug build, `nice`, a shared 2-core machine, 2026-12-01), no
//! finding in any: loader 1,412,935 inputs in 600 s (seed 20261201); envelope
//! 22,060,827 in 600 s (seed 20261202, before duplicate keys were refused) and
//! 6,069,575 in 600 s (seed 20261203, the parser as it is); team file 224,370 in 480 s
//! (seed 20261204).
//!
//! CI uses a fixed seed, so it runs the same inputs every time; `INLET_FUZZ_SEED=random`
//! draws a new one, and any number replays a run (the seed is printed at the start). A
//! failure prints the input in hex, and `INLET_FUZZ_REPLAY=<hex>` runs that one input
//! alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use inlet::config::{Config, ConfigErrors};
use inlet::source::push::PushEnvelope;

/// The seed of a run that sets none (CI).
const DEFAULT_SEED: u64 = 0x1e7_f022;

/// One input may take at most this long before the run is declared hung.
const HANG: Duration = Duration::from_secs(30);

/// How long a run goes: a number of inputs, or a time budget (`INLET_FUZZ_SECONDS`).
#[derive(Clone, Copy, Debug)]
enum Budget {
    Inputs(u64),
    Time(Duration),
}

struct Plan {
    seed: u64,
    budget: Budget,
    replay: Option<Vec<u8>>,
}

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")))
}

fn plan(target: &str, default_inputs: u64) -> Plan {
    // CI runs the same inputs every time (a run that passes today passes tomorrow);
    // `INLET_FUZZ_SEED=random` draws a new seed, any number replays one.
    let seed = match std::env::var("INLET_FUZZ_SEED").as_deref().map(str::trim) {
        Ok("random") => fastrand::u64(..),
        Ok(_) => env_number("INLET_FUZZ_SEED").expect("set"),
        Err(_) => DEFAULT_SEED,
    };
    let budget = match (env_number("INLET_FUZZ_SECONDS"), env_number("INLET_FUZZ_ITERATIONS")) {
        (Some(s), _) => Budget::Time(Duration::from_secs(s)),
        (None, Some(n)) => Budget::Inputs(n),
        (None, None) => Budget::Inputs(default_inputs),
    };
    let replay = std::env::var("INLET_FUZZ_REPLAY").ok().map(|hex| from_hex(hex.trim()));
    eprintln!("fuzz {target}: seed {seed} (INLET_FUZZ_SEED={seed} replays it), budget {budget:?}");
    Plan { seed, budget, replay }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "INLET_FUZZ_REPLAY must be hex");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("INLET_FUZZ_REPLAY must be hex"))
        .collect()
}

/// What a parser made of one input, when it kept its contract.
enum Verdict {
    Accepted,
    Refused,
}

/// Inputs accepted and refused in a run.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    accepted: u64,
    refused: u64,
}

/// Runs `check` on the inputs `next` makes, on a worker thread watched for hangs. A
/// panic in the parser or a broken contract (`check` returns `Err`) fails the test
/// with the seed, the input number and the input in hex; so does one input taking
/// longer than [`HANG`]. Returns the number of inputs run.
fn run(
    target: &'static str,
    plan: Plan,
    mut next: impl FnMut(&mut fastrand::Rng) -> Vec<u8> + Send + 'static,
    check: impl Fn(&[u8]) -> Result<Verdict, String> + Send + Sync + 'static,
) -> Tally {
    let current = Arc::new(Mutex::new(Vec::<u8>::new()));
    let done = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<Result<Tally, (u64, Vec<u8>, String)>>();
    let seed = plan.seed;
    let worker = {
        let current = Arc::clone(&current);
        let done = Arc::clone(&done);
        std::thread::Builder::new()
            .name(format!("fuzz-{target}"))
            // The parsers bound their nesting; a small stack would show it if they did not.
            .stack_size(8 << 20)
            .spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed);
                let started = Instant::now();
                let mut n: u64 = 0;
                let mut tally = Tally::default();
                loop {
                    let more = match (&plan.replay, plan.budget) {
                        (Some(_), _) => n == 0,
                        (None, Budget::Inputs(max)) => n < max,
                        (None, Budget::Time(t)) => started.elapsed() < t,
                    };
                    if !more {
                        break;
                    }
                    let input = match &plan.replay {
                        Some(bytes) => bytes.clone(),
                        None => next(&mut rng),
                    };
                    *current.lock().unwrap() = input.clone();
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&input)));
                    let broken = match outcome {
                        Ok(Ok(Verdict::Accepted)) => {
                            tally.accepted += 1;
                            None
                        }
                        Ok(Ok(Verdict::Refused)) => {
                            tally.refused += 1;
                            None
                        }
                        Ok(Err(why)) => Some(why),
                        Err(panic) => Some(format!(
                            "panicked: {}",
                            panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        )),
                    };
                    if let Some(why) = broken {
                        let _ = tx.send(Err((n, input, why)));
                        return;
                    }
                    n += 1;
                    done.store(n, Ordering::Relaxed);
                }
                let _ = tx.send(Ok(tally));
            })
            .expect("start the fuzz worker")
    };
    let mut seen = 0;
    let mut last_progress = Instant::now();
    let result = loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(result) => break result,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("fuzz {target}: the worker died without a word"),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = done.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > HANG {
                    let input = current.lock().unwrap().clone();
                    panic!(
                        "fuzz {target}: seed {seed}, input {now} hangs (over {HANG:?}); replay with \
                         INLET_FUZZ_REPLAY={}",
                        hex(&input)
                    );
                }
            }
        }
    };
    worker.join().expect("the fuzz worker ends");
    match result {
        Ok(tally) => tally,
        Err((n, input, why)) => panic!(
            "fuzz {target}: seed {seed}, input {n}: {why}\n  input ({} bytes): {}\n  text: {:?}\n  replay with \
             INLET_FUZZ_REPLAY={}",
            input.len(),
            hex(&input).chars().take(20_000).collect::<String>(),
            String::from_utf8_lossy(&input).chars().take(2_000).collect::<String>(),
            hex(&input)
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------

/// One random edit of `input`: flip, insert, delete, duplicate, splice in a token or a
/// piece of another seed, truncate.
fn mutate(rng: &mut fastrand::Rng, input: &mut Vec<u8>, tokens: &[&[u8]], seeds: &[Vec<u8>]) {
    let at = |rng: &mut fastrand::Rng, v: &Vec<u8>| if v.is_empty() { 0 } else { rng.usize(..=v.len()) };
    match rng.u8(..10) {
        0 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            input[i] ^= 1 << rng.u8(..8);
        }
        1 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            input[i] = rng.u8(..);
        }
        2 => {
            let i = at(rng, input);
            input.insert(i, rng.u8(..));
        }
        3 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            let n = rng.usize(1..=input.len().saturating_sub(i).clamp(1, 64));
            input.drain(i..(i + n).min(input.len()));
        }
        4 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            let n = rng.usize(1..=(input.len() - i).min(256));
            let piece: Vec<u8> = input[i..i + n].to_vec();
            let j = at(rng, input);
            input.splice(j..j, piece);
        }
        5..=7 => {
            let token = tokens[rng.usize(..tokens.len())];
            let i = at(rng, input);
            if rng.bool() && i < input.len() {
                // Replace what follows up to the next separator.
                let end = input[i..].iter().position(|b| b" \n,=]}\"".contains(b)).map_or(input.len(), |p| i + p);
                input.splice(i..end, token.iter().copied());
            } else {
                input.splice(i..i, token.iter().copied());
            }
        }
        8 => {
            let other = &seeds[rng.usize(..seeds.len())];
            if !other.is_empty() {
                let i = rng.usize(..other.len());
                let n = rng.usize(1..=(other.len() - i).min(512));
                let j = at(rng, input);
                input.splice(j..j, other[i..i + n].iter().copied());
            }
        }
        _ if !input.is_empty() => {
            let n = rng.usize(..input.len());
            input.truncate(n);
        }
        _ => input.extend_from_slice(tokens[rng.usize(..tokens.len())]),
    }
}

/// A seed with 1 to 8 edits.
fn mutant(rng: &mut fastrand::Rng, seeds: &[Vec<u8>], tokens: &[&[u8]]) -> Vec<u8> {
    let mut input = seeds[rng.usize(..seeds.len())].clone();
    for _ in 0..rng.usize(1..=8) {
        mutate(rng, &mut input, tokens, seeds);
    }
    input
}

// ---------------------------------------------------------------------------------------
// The routing-file loader
// ---------------------------------------------------------------------------------------

const TOML_TOKENS: &[&[u8]] = &[
    b"[",
    b"]",
    b"[[",
    b"]]",
    b"{",
    b"}",
    b"=",
    b",",
    b".",
    b"\"",
    b"'",
    b"'''",
    b"\"\"\"",
    b"\n",
    b"#",
    b"\\",
    b"\\u0000",
    b"\\U0010FFFF",
    b"\\ud800",
    b"\x00",
    b"\xff",
    b"\xef\xbb\xbf",
    b"\r\n",
    b"\t",
    b"1e999",
    b"-0",
    b"nan",
    b"inf",
    b"-inf",
    b"0x7fffffffffffffff",
    b"99999999999999999999",
    b"-1",
    b"0",
    b"true",
    b"1979-05-27T07:32:00Z",
    b"\"10s\"",
    b"\"0s\"",
    b"\"1ms\"",
    b"\"99999999999999d\"",
    b"\"-5s\"",
    b"\"\"",
    b"\"${INLET_X}\"",
    b"\"${\"",
    b"\"${UNSET_VAR}\"",
    b"\"$${X}\"",
    b"[[route]]",
    b"[store]",
    b"[server]",
    b"[admin]",
    b"[push]",
    b"[plugins]",
    b"[route.target]",
    b"name",
    b"plugin",
    b"source",
    b"target",
    b"kind",
    b"url",
    b"timeout",
    b"lease",
    b"retry",
    b"not_yet",
    b"limits",
    b"ordering",
    b"parked",
    b"concurrency",
    b"max_steps",
    b"subscription",
    b"topic",
    b"\"push\"",
    b"\"pubsub\"",
    b"\"http\"",
    b"\"log\"",
    b"\"per-key\"",
    b"\"block-key\"",
    b"\"pass\"",
    b"tokens",
    b"role",
    b"routes",
    b"auth",
    b"\"none-loopback\"",
    b"audience",
    b"service_account",
    b"headers",
    b"attributes",
    b"max_body_mib",
    b"request_timeout",
    b"memory_mib",
    b"fuel",
    b"call_timeout",
    b"max_attempts",
    b"jitter",
    b"multiplier",
    b"initial",
    b"max",
    b"deadline",
    b"\"sqlite://x.db\"",
    b"\"postgres://u:p@h/db\"",
    b"\"projects/p/subscriptions/s\"",
    b"\"projects/p/topics/t\"",
    b"\"http://127.0.0.1:1/x\"",
];

fn toml_seeds() -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut add_dir = |dir: PathBuf| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        found.sort();
        for p in found {
            if p.is_dir() {
                for q in std::fs::read_dir(&p).unwrap() {
                    let q = q.unwrap().path();
                    if q.extension().is_some_and(|e| e == "toml") {
                        files.push(q);
                    }
                }
            } else if p.extension().is_some_and(|e| e == "toml") {
                files.push(p);
            }
        }
    };
    add_dir(root.join("config"));
    add_dir(root.join("tests/ui"));
    files.sort();
    let seeds: Vec<(PathBuf, Vec<u8>)> = files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    assert!(seeds.len() >= 20, "found only {} routing files to start from", seeds.len());
    seeds
}

/// `INLET_X` is set, everything else is not.
fn fuzz_env(name: &str) -> Option<String> {
    (name == "INLET_X").then(|| "value-of-x".to_string())
}

/// The loader's contract for one file: `Ok`, or errors that each name this file and
/// a line and column inside the text.
fn loader_contract(path: &Path, text: &str, result: Result<Config, ConfigErrors>) -> Result<Verdict, String> {
    let Err(errors) = result else { return Ok(Verdict::Accepted) };
    if errors.0.is_empty() {
        return Err("an error without any error in it".into());
    }
    let lines = text.split('\n').count();
    for e in &errors.0 {
        let shown = e.to_string();
        if e.file != path {
            return Err(format!("an error names another file: {shown}"));
        }
        if e.line == 0 || e.column == 0 {
            return Err(format!("an error names no line: {shown}"));
        }
        if e.line > lines {
            return Err(format!("an error names line {} of a {lines}-line file: {shown}", e.line));
        }
        if !shown.starts_with(&format!("{}:{}:{}", path.display(), e.line, e.column)) {
            return Err(format!("an error does not start with file:line:column: {shown}"));
        }
        if e.kind.to_string().trim().is_empty() {
            return Err(format!("an error that says nothing: {shown:?}"));
        }
    }
    Ok(Verdict::Refused)
}

#[test]
fn fuzz_routing_file_loader() {
    let seeds = toml_seeds();
    let scratch = tempfile::tempdir().unwrap();
    // Mutants are checked as if they were the file they came from (plugin paths are
    // relative to it); those that are not UTF-8 go through a real file.
    let path = seeds[0].0.clone();
    let on_disk = scratch.path().join("inlet.toml");
    let bytes: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    let plan = plan("loader", 10_000);
    let seeds_for_gen = bytes.clone();
    let tally = run(
        "loader",
        plan,
        move |rng| mutant(rng, &seeds_for_gen, TOML_TOKENS),
        move |input| match std::str::from_utf8(input) {
            Ok(text) => loader_contract(&path, text, Config::from_str(&path, text, &fuzz_env)),
            Err(_) => {
                std::fs::write(&on_disk, input).map_err(|e| format!("cannot write the scratch file: {e}"))?;
                let lossy = String::from_utf8_lossy(input);
                loader_contract(&on_disk, &lossy, Config::load(&on_disk))
            }
        },
    );
    eprintln!(
        "fuzz loader: {} inputs ({} loaded, {} refused), no finding",
        tally.accepted + tally.refused,
        tally.accepted,
        tally.refused
    );
    assert!(tally.accepted > 0 && tally.refused > 0, "the mutants explore both outcomes: {tally:?}");
}

/// A team's file in a directory, mutated: whatever it holds, the other files' routes
/// load and the load itself succeeds — unless the mutant declares a shared table
/// (`[store]`, `[server]`, …), the one way a team file may stop everything, and then
/// the error names the mutant. Every error names its file and a line.
#[test]
fn fuzz_a_team_file_refuses_only_itself() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let plugin = root.join("tests/ui/fake-plugin.bin");
    std::fs::write(
        dir.path().join("00-platform.toml"),
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[[route]]\nname = \"platform\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            plugin.display()
        ),
    )
    .unwrap();
    let team = dir.path().join("team.toml");
    let mut seeds: Vec<Vec<u8>> =
        toml_seeds().into_iter().map(|(_, b)| b).filter(|b| !b.windows(7).any(|w| w == b"[store]")).collect();
    seeds.push(std::fs::read(root.join("tests/ui/dir-valid/orders.toml")).unwrap());
    let plan = plan("team-file", 3_000);
    let dir_path = dir.path().to_path_buf();
    let tally = run(
        "team-file",
        plan,
        move |rng| mutant(rng, &seeds, TOML_TOKENS),
        move |input| {
            std::fs::write(&team, input).map_err(|e| format!("cannot write the team file: {e}"))?;
            let lossy = String::from_utf8_lossy(input).into_owned();
            match Config::load_partial(&dir_path) {
                Ok(config) => {
                    if !config.routes.iter().any(|r| r.name.as_str() == "platform") {
                        return Err(format!(
                            "the platform's route did not load beside the team file: {:?}",
                            config.refused
                        ));
                    }
                    for refused in &config.refused {
                        if refused.file != team {
                            return Err(format!("a route of another file was refused: {}", refused.errors));
                        }
                        loader_contract(&team, &lossy, Err(refused.errors.clone()))?;
                    }
                    Ok(if config.refused.is_empty() { Verdict::Accepted } else { Verdict::Refused })
                }
                Err(errors) => {
                    let shared = ["store", "server", "plugins", "admin", "push"];
                    let declares_shared =
                        toml::from_str::<toml::Table>(&lossy).is_ok_and(|t| shared.iter().any(|k| t.contains_key(*k)));
                    if !declares_shared {
                        return Err(format!("a team file without shared tables stopped the load:\n{errors}"));
                    }
                    let mine: Vec<_> = errors.0.iter().filter(|e| e.file == team).cloned().collect();
                    if mine.is_empty() {
                        return Err(format!("the load stopped without naming the team file:\n{errors}"));
                    }
                    loader_contract(&team, &lossy, Err(ConfigErrors(mine)))?;
                    Ok(Verdict::Refused)
                }
            }
        },
    );
    eprintln!(
        "fuzz team-file: {} inputs ({} loaded whole, {} refused), no finding",
        tally.accepted + tally.refused,
        tally.accepted,
        tally.refused
    );
    assert!(tally.accepted > 0 && tally.refused > 0, "the mutants explore both outcomes: {tally:?}");
}

// ---------------------------------------------------------------------------------------
// The push envelope
// ---------------------------------------------------------------------------------------

const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"\"",
    b"\\",
    b"null",
    b"true",
    b"false",
    b"0",
    b"-1",
    b"1.5",
    b"1e999",
    b"-0",
    b"18446744073709551616",
    b"4294967296",
    b"4294967295",
    b"\"\"",
    b"\"message\"",
    b"\"data\"",
    b"\"attributes\"",
    b"\"messageId\"",
    b"\"message_id\"",
    b"\"publishTime\"",
    b"\"publish_time\"",
    b"\"subscription\"",
    b"\"deliveryAttempt\"",
    b"\"delivery_attempt\"",
    b"\"orderingKey\"",
    b"\\u0000",
    b"\\ud800",
    b"\\udc00",
    b"\\uD83D\\uDE00",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"\"eA==\"",
    b"\"eA\"",
    b"\"e-_A\"",
    b"\"+/+/\"",
    b"\"====\"",
    b"\"QR==\"",
    b"\"!!\"",
    b"[[[[[[[[[[",
    b"]]]]]]]]]]",
    b"{\"a\":{\"a\":{\"a\":",
    b"\"\\n\"",
    b" ",
    b"\n",
    b"\t",
];

fn envelope_seeds() -> Vec<Vec<u8>> {
    let b64 = |d: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, d);
    let order = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;
    vec![
        format!(
            r#"{{"message":{{"data":"{}","attributes":{{"eventId":"e-1"}},"messageId":"m-1","publishTime":"2026-08-01T10:00:00Z"}},"subscription":"projects/p/subscriptions/s","deliveryAttempt":2}}"#,
            b64(order)
        ),
        format!(
            r#"{{"message":{{"data":"{0}","message_id":"m-2","messageId":"m-2","publish_time":"t","publishTime":"t","attributes":{{}}}},"subscription":"s"}}"#,
            b64(b"x")
        ),
        r#"{"message":{"messageId":"m-3"}}"#.to_string(),
        r#"{"message":{"messageId":"m-4","data":null,"attributes":null,"publishTime":null},"subscription":null,"delivery_attempt":0}"#.to_string(),
        format!(r#"{{"message":{{"messageId":"m-5","data":"{}","orderingKey":"k"}}}}"#, b64(&[0, 159, 255, 1])),
        r#"{"message":{"messageId":"m-6","data":"eA","attributes":{"a":"","b":"\u0000"}}}"#.to_string(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

/// The fields an envelope error may name.
fn known_field(field: &str) -> bool {
    const FIELDS: &[&str] = &[
        "body",
        "message",
        "message.messageId",
        "message.message_id",
        "message.data",
        "message.attributes",
        "message.publishTime",
        "message.publish_time",
        "message.orderingKey",
        "message.ordering_key",
        "subscription",
        "deliveryAttempt",
        "delivery_attempt",
    ];
    FIELDS.contains(&field) || field.starts_with("message.attributes.")
}

/// The parser's contract for one body: `Ok` only for a JSON object with a `message`
/// object and a message id; else an error naming a known field, `body` exactly when
/// the bytes are not a JSON object.
fn envelope_contract(input: &[u8]) -> Result<Verdict, String> {
    let as_json = serde_json::from_slice::<serde_json::Value>(input).ok();
    let is_object = as_json.as_ref().is_some_and(|v| v.is_object());
    match PushEnvelope::parse(input) {
        Ok(incoming) => {
            if !is_object || !as_json.as_ref().is_some_and(|v| v["message"].is_object()) {
                return Err("accepted a body without a message object".into());
            }
            if incoming.message_id.is_empty() {
                return Err("accepted a message without an id".into());
            }
            // What was taken is what the body says.
            let m = &as_json.as_ref().expect("an object")["message"];
            let id = m["messageId"].as_str().or(m["message_id"].as_str());
            if id != Some(incoming.message_id.as_str()) {
                return Err(format!("message id {:?}, the body says {id:?}", incoming.message_id));
            }
            // The ordering key is kept as one more attribute, `ordering_key`.
            let ordering_key = m["orderingKey"].as_str().or(m["ordering_key"].as_str()).filter(|k| !k.is_empty());
            let attributes = m["attributes"].as_object().map_or(0, |a| a.len()) + usize::from(ordering_key.is_some());
            if incoming.attributes.len() != attributes {
                return Err(format!("{} attributes taken of {attributes}", incoming.attributes.len()));
            }
            if let Some(key) = ordering_key
                && !incoming.attributes.iter().any(|(k, v)| k == "ordering_key" && v == key)
            {
                return Err(format!("the ordering key {key:?} was not kept as `ordering_key`"));
            }
            let data = m["data"].as_str().unwrap_or_default();
            if incoming.data.is_empty() != data.trim_end_matches('=').is_empty() {
                return Err(format!("data {:?} read as {} bytes", data, incoming.data.len()));
            }
            Ok(Verdict::Accepted)
        }
        Err(e) => {
            // A key given twice is named by its path, wherever it is.
            if e.problem == "appears twice in one object" {
                return Ok(Verdict::Refused);
            }
            if !known_field(&e.field) {
                return Err(format!("the error names an unknown field `{}`: {e}", e.field));
            }
            if (e.field == "body") == is_object {
                return Err(format!("`body` blamed for a JSON object, or a field for a non-object: {e}"));
            }
            let shown = e.to_string();
            if !shown.contains(&format!("`{}`", e.field)) || e.problem.trim().is_empty() {
                return Err(format!("the message does not name its field: {shown}"));
            }
            Ok(Verdict::Refused)
        }
    }
}

const FIELD_NAMES: &[&str] = &[
    "message",
    "data",
    "attributes",
    "messageId",
    "message_id",
    "publishTime",
    "publish_time",
    "orderingKey",
    "ordering_key",
    "subscription",
    "deliveryAttempt",
    "delivery_attempt",
    "orderingKey",
    "eventId",
    "",
    "\u{0}",
];

/// A random JSON value of any type, nested at most `depth` deep.
fn random_value(rng: &mut fastrand::Rng, depth: usize) -> serde_json::Value {
    use serde_json::{Value, json};
    let b64 = |bytes: &[u8], url: bool| {
        let engine = if url {
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
        } else {
            &base64::engine::general_purpose::STANDARD
        };
        base64::Engine::encode(engine, bytes)
    };
    match rng.u8(..if depth == 0 { 7 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.bool()),
        2 => json!(rng.i64(..)),
        3 => json!([rng.u64(..), u32::MAX as u64 + 1, 0][rng.usize(..3)]),
        4 => json!([1.5, -0.0, 1e300, -1.0][rng.usize(..4)]),
        5 | 6 => {
            let bytes: Vec<u8> = (0..rng.usize(..24)).map(|_| rng.u8(..)).collect();
            let text: String = (0..rng.usize(..12)).map(|_| rng.char(..)).collect();
            Value::String(match rng.u8(..5) {
                0 => b64(&bytes, false),
                1 => b64(&bytes, true),
                2 => text,
                3 => format!("{}\u{0}", FIELD_NAMES[rng.usize(..FIELD_NAMES.len())]),
                _ => String::new(),
            })
        }
        7 => Value::Array((0..rng.usize(..4)).map(|_| random_value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.usize(..4))
                .map(|_| (FIELD_NAMES[rng.usize(..FIELD_NAMES.len())].to_string(), random_value(rng, depth - 1)))
                .collect(),
        ),
    }
}

/// One structural edit somewhere in `v`: a field dropped, added or replaced by a value
/// of another type, an element pushed or removed.
fn mutate_value(rng: &mut fastrand::Rng, v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(map) if !map.is_empty() && rng.u8(..3) == 0 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.usize(..keys.len())];
            match rng.u8(..3) {
                0 => {
                    map.remove(key);
                }
                1 => mutate_value(rng, map.get_mut(key).expect("the key is there")),
                _ => {
                    map.insert(key.clone(), random_value(rng, 3));
                }
            }
        }
        Value::Object(map) if rng.bool() => {
            let key = FIELD_NAMES[rng.usize(..FIELD_NAMES.len())].to_string();
            map.insert(key, random_value(rng, 3));
        }
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = keys[rng.usize(..keys.len())].clone();
            mutate_value(rng, map.get_mut(&key).expect("the key is there"));
        }
        Value::Array(items) if !items.is_empty() && rng.bool() => {
            let i = rng.usize(..items.len());
            if rng.bool() {
                items.remove(i);
            } else {
                mutate_value(rng, &mut items[i]);
            }
        }
        _ => *v = random_value(rng, 3),
    }
}

/// A seed with a few structural edits, re-serialized, and now and then a byte edit.
fn json_mutant(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&seeds[rng.usize(..seeds.len())]).expect("seeds are JSON");
    for _ in 0..rng.usize(1..=4) {
        mutate_value(rng, &mut v);
    }
    let mut out = serde_json::to_vec(&v).expect("a value serializes");
    if rng.u8(..4) == 0 {
        mutate(rng, &mut out, JSON_TOKENS, seeds);
    }
    out
}

#[test]
fn fuzz_push_envelope_parser() {
    let seeds = envelope_seeds();
    for s in &seeds {
        PushEnvelope::parse(s).unwrap_or_else(|e| panic!("a seed envelope is refused: {e}"));
    }
    let plan = plan("envelope", 40_000);
    // Half byte-level mutants (mostly not JSON any more), half structural ones (JSON
    // of the wrong shape, which is where the field checks live).
    let next = move |rng: &mut fastrand::Rng| {
        if rng.bool() { mutant(rng, &seeds, JSON_TOKENS) } else { json_mutant(rng, &seeds) }
    };
    let tally = run("envelope", plan, next, envelope_contract);
    eprintln!(
        "fuzz envelope: {} inputs ({} parsed, {} refused), no finding",
        tally.accepted + tally.refused,
        tally.accepted,
        tally.refused
    );
    assert!(tally.accepted > 0 && tally.refused > 0, "the mutants explore both outcomes: {tally:?}");
}

/// The contracts themselves catch what they should (a fuzzer whose oracle accepts
/// everything finds nothing).
#[test]
fn the_fuzz_oracles_reject_broken_answers() {
    let path = Path::new("x.toml");
    let text = "a = 1\n";
    let whole = Config::load(Path::new("/nonexistent/inlet-fuzz-oracle.toml")).map(|_| ());
    let whole = whole.expect_err("a missing file is an error");
    assert!(loader_contract(path, text, Err(whole)).is_err(), "an error naming another file and no line");
    assert!(loader_contract(path, text, Err(ConfigErrors(Vec::new()))).is_err());
    let syntax = Config::from_str(path, "[store\n", &fuzz_env);
    assert!(syntax.is_err(), "a syntax error");
    assert!(loader_contract(path, "[store\n", syntax).is_ok(), "a syntax error names its line");
    assert!(envelope_contract(br#"{"message":{"messageId":"m"}}"#).is_ok());
    assert!(envelope_contract(b"[]").is_ok(), "`body` is blamed for an array");
}
