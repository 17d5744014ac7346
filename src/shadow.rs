//! Shadow rollout: a route's candidate plugin (`candidate = …` in its routing file)
//! sees the traffic its serving plugin sees and answers too, but nothing it answers
//! is used. For each message it decodes too; at each delivery it renders too and
//! classifies the real answer, with the inputs the serving plugin had. The two
//! answers are compared part by part and every difference counted, with a bounded
//! set of samples showing both sides.
//!
//! The candidate never stands on the serving path:
//! - the serving path hands it a copy of the inputs with `try_send` on a bounded
//!   queue (bounded in jobs and in bytes) and goes on; when the candidate falls
//!   behind, its work is dropped and counted, never queued in front of deliveries;
//! - its calls run on a thread of their own (one current-thread runtime for every
//!   candidate of the process, in the idle scheduling class), under its own plugin
//!   limits, with instances charged to their own memory budget
//!   ([`crate::plugin::sandbox::SHADOW_BUDGET`]), and paced by the CPU it uses (each
//!   fault charged as [`FAULT_CHARGE`] more: it costs a new instance) and the memory
//!   it maps and unmaps ([`Pacing`]): a candidate that sleeps, traps or hoards memory
//!   slows and fills only itself;
//! - nothing it renders is sent: this module has no target.
//!
//! The report (counts, samples) lives in the process: each instance reports what it
//! compared (`GET /api/routes/{name}/shadow`); the metrics add up across instances.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::clock::Millis;
use crate::config::{PluginFile, PluginLimits};
use crate::plugin::{Plugin, PluginFault, wit};
use crate::telemetry::Metrics;

/// Jobs waiting for a route's candidate, at most.
const QUEUE_JOBS: usize = 1024;
/// Bytes of inputs (payloads, bodies) waiting for a route's candidate, at most.
const QUEUE_BYTES: usize = 64 << 20;
/// Jobs of one candidate in progress at once.
const IN_FLIGHT: usize = 4;
/// Samples of differences kept per route (the most recent).
pub const SAMPLES: usize = 20;
/// Bytes of a body or header value kept in a sample side.
const SAMPLE_BYTES: usize = 4096;

/// What a plugin answered to `decode`, as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum DecodeSide {
    Event {
        event_type: String,
        correlation_key: String,
        dedup_key: Option<String>,
        schema_version: Option<String>,
        #[serde(serialize_with = "bytes_as_text")]
        body: Vec<u8>,
    },
    Ignore {
        reason: String,
    },
    Error {
        message: String,
    },
    Fault {
        fault: &'static str,
    },
}

/// A rendered request, as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestSide {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    #[serde(serialize_with = "bytes_as_text")]
    pub body: Vec<u8>,
}

/// What a plugin answered to `render`, as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum RenderSide {
    Request(RequestSide),
    Error { message: String },
    Fault { fault: &'static str },
}

/// What a plugin answered to `classify`, as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum ClassifySide {
    Done,
    Retry {
        hint_ms: Option<u64>,
    },
    NotYet {
        reason: String,
    },
    Park {
        reason: String,
    },
    Ignore {
        reason: String,
    },
    Next {
        request: RequestSide,
        #[serde(serialize_with = "bytes_as_text")]
        state: Vec<u8>,
    },
    Fault {
        fault: &'static str,
    },
}

impl DecodeSide {
    pub fn of(answer: &Result<Result<wit::Decoded, wit::DecodeError>, PluginFault>) -> DecodeSide {
        match answer {
            Ok(Ok(wit::Decoded::Event(ev))) => DecodeSide::Event {
                event_type: ev.event_type.clone(),
                correlation_key: ev.correlation_key.clone(),
                dedup_key: ev.dedup_key.clone(),
                schema_version: ev.schema_version.clone(),
                body: ev.body.clone(),
            },
            Ok(Ok(wit::Decoded::Ignore(reason))) => DecodeSide::Ignore { reason: reason.clone() },
            Ok(Err(e)) => DecodeSide::Error { message: e.message.clone() },
            Err(fault) => DecodeSide::Fault { fault: fault.kind() },
        }
    }

    pub fn fault(&self) -> Option<&'static str> {
        match self {
            DecodeSide::Fault { fault } => Some(*fault),
            _ => None,
        }
    }

    /// The parts in which `other` differs from `self`.
    pub fn differences(&self, other: &DecodeSide) -> Vec<&'static str> {
        use DecodeSide::*;
        match (self, other) {
            (
                Event { event_type: t1, correlation_key: k1, dedup_key: d1, schema_version: v1, body: b1 },
                Event { event_type: t2, correlation_key: k2, dedup_key: d2, schema_version: v2, body: b2 },
            ) => differing([
                ("event_type", t1 != t2),
                ("correlation_key", k1 != k2),
                ("dedup_key", d1 != d2),
                ("schema_version", v1 != v2),
                ("body", b1 != b2),
            ]),
            (Ignore { reason: a }, Ignore { reason: b }) | (Error { message: a }, Error { message: b }) => {
                differing([("reason", a != b)])
            }
            (Fault { fault: a }, Fault { fault: b }) if a == b => vec![],
            _ => vec!["answer"],
        }
    }
}

impl RequestSide {
    pub fn of(r: &wit::Request) -> RequestSide {
        RequestSide { method: r.method.clone(), path: r.path.clone(), headers: r.headers.clone(), body: r.body.clone() }
    }

    pub fn differences(&self, other: &RequestSide) -> Vec<&'static str> {
        differing([
            ("method", self.method != other.method),
            ("path", self.path != other.path),
            ("headers", self.headers != other.headers),
            ("body", self.body != other.body),
        ])
    }
}

impl RenderSide {
    pub fn of(answer: &Result<Result<wit::Request, String>, PluginFault>) -> RenderSide {
        match answer {
            Ok(Ok(r)) => RenderSide::Request(RequestSide::of(r)),
            Ok(Err(message)) => RenderSide::Error { message: message.clone() },
            Err(fault) => RenderSide::Fault { fault: fault.kind() },
        }
    }

    pub fn fault(&self) -> Option<&'static str> {
        match self {
            RenderSide::Fault { fault } => Some(*fault),
            _ => None,
        }
    }

    pub fn differences(&self, other: &RenderSide) -> Vec<&'static str> {
        match (self, other) {
            (RenderSide::Request(a), RenderSide::Request(b)) => a.differences(b),
            (RenderSide::Error { message: a }, RenderSide::Error { message: b }) => differing([("reason", a != b)]),
            (RenderSide::Fault { fault: a }, RenderSide::Fault { fault: b }) if a == b => vec![],
            _ => vec!["answer"],
        }
    }
}

impl ClassifySide {
    pub fn of(answer: &Result<wit::Disposition, PluginFault>) -> ClassifySide {
        match answer {
            Ok(wit::Disposition::Done) => ClassifySide::Done,
            Ok(wit::Disposition::Retry(hint)) => ClassifySide::Retry { hint_ms: *hint },
            Ok(wit::Disposition::NotYet(reason)) => ClassifySide::NotYet { reason: reason.clone() },
            Ok(wit::Disposition::Park(reason)) => ClassifySide::Park { reason: reason.clone() },
            Ok(wit::Disposition::Ignore(reason)) => ClassifySide::Ignore { reason: reason.clone() },
            Ok(wit::Disposition::Next(next)) => {
                ClassifySide::Next { request: RequestSide::of(&next.request), state: next.state.clone() }
            }
            Err(fault) => ClassifySide::Fault { fault: fault.kind() },
        }
    }

    pub fn fault(&self) -> Option<&'static str> {
        match self {
            ClassifySide::Fault { fault } => Some(*fault),
            _ => None,
        }
    }

    pub fn differences(&self, other: &ClassifySide) -> Vec<&'static str> {
        use ClassifySide::*;
        match (self, other) {
            (Done, Done) => vec![],
            (Retry { hint_ms: a }, Retry { hint_ms: b }) => differing([("hint", a != b)]),
            (NotYet { reason: a }, NotYet { reason: b })
            | (Park { reason: a }, Park { reason: b })
            | (Ignore { reason: a }, Ignore { reason: b }) => differing([("reason", a != b)]),
            (Next { request: r1, state: s1 }, Next { request: r2, state: s2 }) => {
                let mut parts: Vec<&'static str> = r1
                    .differences(r2)
                    .into_iter()
                    .map(|p| match p {
                        "method" => "next.method",
                        "path" => "next.path",
                        "headers" => "next.headers",
                        _ => "next.body",
                    })
                    .collect();
                if s1 != s2 {
                    parts.push("next.state");
                }
                parts
            }
            (Fault { fault: a }, Fault { fault: b }) if a == b => vec![],
            _ => vec!["disposition"],
        }
    }
}

/// The names of the parts that differ, in the order given.
fn differing<const N: usize>(parts: [(&'static str, bool); N]) -> Vec<&'static str> {
    parts.into_iter().filter_map(|(part, differs)| differs.then_some(part)).collect()
}

fn bytes_as_text<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

/// One step of a delivery as the serving plugin went through it: the exchange and
/// the target's answer `classify` was given, and what it made of them.
#[derive(Debug, Clone)]
pub struct StepSeen {
    pub exchange: wit::Exchange,
    pub outcome: wit::Outcome,
    pub serving: ClassifySide,
}

/// Work for a candidate: the serving plugin's inputs and answers.
#[derive(Debug)]
pub enum Job {
    Decode { message: wit::Message, serving: DecodeSide },
    Deliver { entry: i64, event: wit::Event, render: RenderSide, steps: Vec<StepSeen> },
}

impl Job {
    /// Bytes of input it holds (what the queue's byte bound counts).
    fn bytes(&self) -> usize {
        match self {
            Job::Decode { message, .. } => {
                message.data.len() + message.attributes.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            }
            Job::Deliver { event, steps, .. } => {
                event.body.len()
                    + steps
                        .iter()
                        .map(|s| match &s.outcome {
                            wit::Outcome::Response(r) => r.body.len() + s.exchange.state.len(),
                            wit::Outcome::TransportError(e) => e.message.len(),
                        })
                        .sum::<usize>()
            }
        }
    }
}

/// Which call a comparison is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Decode,
    Render,
    Classify,
}

impl Call {
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Decode => "decode",
            Call::Render => "render",
            Call::Classify => "classify",
        }
    }
}

/// The counts of one call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CallCounts {
    /// Answers of both sides compared.
    pub compared: u64,
    /// Of those, how many differed in some part.
    pub differing: u64,
    /// Differences by part (`path`, `body`, `disposition`, …).
    pub parts: BTreeMap<String, u64>,
    /// Candidate calls that faulted (by kind), not compared.
    pub faults: BTreeMap<String, u64>,
}

/// Both sides of one differing answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub at: Millis,
    pub call: Call,
    /// The entry delivered (render, classify).
    pub entry: Option<i64>,
    /// The broker's message id (decode).
    pub message_id: Option<String>,
    /// The exchange step classified (classify).
    pub step: Option<u32>,
    pub parts: Vec<String>,
    pub serving: serde_json::Value,
    pub candidate: serde_json::Value,
}

/// What a shadow has seen since its candidate version started.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    pub decode: CallCounts,
    pub render: CallCounts,
    pub classify: CallCounts,
    /// Jobs dropped because the candidate was behind (its queue full).
    pub dropped: u64,
}

impl Counts {
    fn call(&mut self, call: Call) -> &mut CallCounts {
        match call {
            Call::Decode => &mut self.decode,
            Call::Render => &mut self.render,
            Call::Classify => &mut self.classify,
        }
    }
}

/// A route's shadow as `GET /api/routes/{name}/shadow` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub route: String,
    /// The candidate's path as the routing file spells it.
    pub candidate: String,
    /// The pinned digest, if the routing file pins one.
    pub candidate_pinned_sha256: Option<String>,
    /// `running` or `refused`.
    pub state: String,
    /// The SHA-256 of the candidate version compared (running).
    pub candidate_sha256: Option<String>,
    /// Why the candidate file does not run (refused).
    pub refused: Option<String>,
    /// When this version's comparison began (ms since the epoch).
    pub since: Millis,
    pub counts: Counts,
    /// The most recent differences, newest last (at most [`SAMPLES`]).
    pub samples: Vec<Sample>,
}

/// The candidate of a route and its report, shared by the serving side (which
/// queues jobs) and the worker (which runs them).
struct State {
    route: String,
    candidate: RwLock<Result<Arc<Plugin>, Refused>>,
    tally: Mutex<Tally>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Clone)]
struct Refused {
    digest: Option<String>,
    reason: String,
}

/// Comparisons counted, and the most recent differences (at most [`SAMPLES`]).
#[derive(Debug, Default)]
pub struct Tally {
    pub since: Millis,
    pub counts: Counts,
    pub samples: VecDeque<Sample>,
}

/// What a comparison is about.
#[derive(Debug, Clone, Default)]
pub struct Where {
    /// The entry delivered (render, classify; replayed decodes too).
    pub entry: Option<i64>,
    /// The broker's message id (decode).
    pub message_id: Option<String>,
    /// The exchange step classified.
    pub step: Option<u32>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally { since: now_ms(), ..Tally::default() }
    }

    /// Counts one comparison of `call` — or, when the candidate faulted (`fault`),
    /// its fault, which is not one — and keeps a sample of a difference. Returns
    /// whether the two answers differed.
    pub fn record<S: Serialize>(
        &mut self,
        call: Call,
        fault: Option<&'static str>,
        parts: &[&'static str],
        at: &Where,
        ours: &S,
        theirs: &S,
    ) -> bool {
        let counts = self.counts.call(call);
        if let Some(kind) = fault {
            *counts.faults.entry(kind.to_string()).or_default() += 1;
            return false;
        }
        counts.compared += 1;
        if parts.is_empty() {
            return false;
        }
        counts.differing += 1;
        for part in parts {
            *counts.parts.entry(part.to_string()).or_default() += 1;
        }
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at: now_ms(),
            call,
            entry: at.entry,
            message_id: at.message_id.clone(),
            step: at.step,
            parts: parts.iter().map(|p| p.to_string()).collect(),
            serving: sample_side(ours),
            candidate: sample_side(theirs),
        });
        true
    }
}

/// A route's shadow: its candidate, the queue to it, and what it found.
pub struct Shadow {
    file: PluginFile,
    limits: PluginLimits,
    state: Arc<State>,
    jobs: mpsc::Sender<(Job, usize)>,
    queued_bytes: Arc<AtomicUsize>,
    /// Size and modification time of the candidate file when last read.
    stamp: Mutex<Option<(u64, Option<std::time::SystemTime>)>>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow").field("route", &self.state.route).field("candidate", &self.file.shown).finish()
    }
}

impl Shadow {
    /// Loads the candidate (slow and blocking: compiling) and starts its worker on
    /// the shadow thread. A candidate that does not load is kept as refused: the
    /// route serves regardless, and the report says why.
    pub fn start(
        route: &str,
        file: &PluginFile,
        limits: &PluginLimits,
        cache: Option<&Path>,
        metrics: Arc<Metrics>,
    ) -> Shadow {
        let stamp = file_stamp(&file.path);
        let candidate = load(file, limits, cache);
        if let Err(refused) = &candidate {
            tracing::warn!(route, candidate = %file.shown.display(), reason = %refused.reason, "shadow candidate refused; the route serves without it");
        }
        let state = Arc::new(State {
            route: route.to_string(),
            candidate: RwLock::new(candidate),
            tally: Mutex::new(Tally::new()),
            metrics,
        });
        state.metrics.register_shadow(route);
        let (tx, rx) = mpsc::channel(QUEUE_JOBS);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        runtime().spawn(work(Arc::clone(&state), rx, Arc::clone(&queued_bytes)));
        Shadow { file: file.clone(), limits: limits.clone(), state, jobs: tx, queued_bytes, stamp: Mutex::new(stamp) }
    }

    /// Whether the candidate runs (else there is no point copying inputs for it).
    pub fn running(&self) -> bool {
        self.state.candidate.read().expect("candidate lock").is_ok()
    }

    /// Hands a job to the candidate without waiting: when its queue is full (in jobs
    /// or bytes) the job is dropped and counted.
    pub fn offer(&self, job: Job) {
        if !self.running() {
            return;
        }
        let bytes = job.bytes();
        let taken = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if taken + bytes > QUEUE_BYTES || self.jobs.try_send((job, bytes)).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.state.tally.lock().expect("shadow lock").counts.dropped += 1;
            self.state.metrics.shadow_dropped.get_or_create(&Metrics::route(&self.state.route)).inc();
        }
    }

    /// Reads the candidate file again if it changed (size or modification time, or
    /// always when `forced`); a new version starts a new comparison. Blocking.
    pub fn reload(&self, cache: Option<&Path>, forced: bool) -> Option<String> {
        let stamp = file_stamp(&self.file.path);
        {
            let mut seen = self.stamp.lock().expect("stamp lock");
            if !forced && stamp.is_some() && *seen == stamp {
                return None;
            }
            *seen = stamp;
        }
        let digest = std::fs::read(&self.file.path).ok().map(|b| crate::inbox::digest_hex(&b));
        let current = match &*self.state.candidate.read().expect("candidate lock") {
            Ok(p) => Some(p.digest().to_string()),
            Err(r) => r.digest.clone(),
        };
        if digest.is_some() && digest == current {
            return None;
        }
        let loaded = load(&self.file, &self.limits, cache);
        let outcome = match &loaded {
            Ok(p) => format!("shadow candidate {} now compared", &p.digest()[..12]),
            Err(r) => format!("shadow candidate refused: {}", r.reason),
        };
        tracing::info!(route = %self.state.route, "{outcome}");
        *self.state.candidate.write().expect("candidate lock") = loaded;
        *self.state.tally.lock().expect("shadow lock") = Tally::new();
        Some(outcome)
    }

    /// What the shadow found so far.
    pub fn report(&self) -> Report {
        let (state, candidate_sha256, refused) = match &*self.state.candidate.read().expect("candidate lock") {
            Ok(p) => ("running", Some(p.digest().to_string()), None),
            Err(r) => ("refused", None, Some(r.reason.clone())),
        };
        let recorded = self.state.tally.lock().expect("shadow lock");
        Report {
            route: self.state.route.clone(),
            candidate: self.file.shown.display().to_string(),
            candidate_pinned_sha256: self.file.sha256.clone(),
            state: state.to_string(),
            candidate_sha256,
            refused,
            since: recorded.since,
            counts: recorded.counts.clone(),
            samples: recorded.samples.iter().cloned().collect(),
        }
    }
}

fn file_stamp(path: &Path) -> Option<(u64, Option<std::time::SystemTime>)> {
    std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok()))
}

fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// Loads a candidate file on the shadow budget.
fn load(file: &PluginFile, limits: &PluginLimits, cache: Option<&Path>) -> Result<Arc<Plugin>, Refused> {
    let (digest, loaded) = crate::plugin::load::load_file(file, limits, cache, true);
    loaded.map_err(|e| Refused { digest, reason: e.to_string() })
}

/// The thread every candidate runs on: one current-thread runtime, started on first
/// use, at a lower scheduling priority than the serving threads.
fn runtime() -> &'static tokio::runtime::Handle {
    static HANDLE: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("inlet-shadow".into())
            .spawn(move || {
                lower_priority();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the shadow runtime starts");
                tx.send(rt.handle().clone()).expect("the starter waits for the handle");
                rt.block_on(std::future::pending::<()>());
            })
            .expect("spawn the shadow thread");
        rx.recv().expect("the shadow thread sends its runtime handle")
    })
}

/// The idle scheduling class for the calling thread (`SCHED_IDLE`), nice 10 where
/// that is refused: when the cores are busy, the serving threads come first. At nice
/// 10 alone a thread keeps a core it was given for the rest of its time slice, and a
/// candidate faulting in fresh memory uses whole slices; a serving thread that wakes
/// takes the core from an idle-class thread at once. Best effort (a failure leaves
/// the thread at normal priority).
fn lower_priority() {
    // SAFETY: plain system calls on the calling thread; `param` lives across the call.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_IDLE, &param);
    }
}

/// The worker of one candidate: runs its jobs, at most [`IN_FLIGHT`] at once, until
/// the route's shadow is dropped (the queue closes).
async fn work(state: Arc<State>, mut rx: mpsc::Receiver<(Job, usize)>, queued: Arc<AtomicUsize>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    while let Some((job, bytes)) = rx.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { break };
        // Over its CPU share or its memory churn, the shadow waits here; meanwhile its
        // queue fills and the serving path's offers are dropped and counted.
        let pause = PACING.lock().expect("shadow pacing lock").pause();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let state = Arc::clone(&state);
        let queued = Arc::clone(&queued);
        tokio::spawn(async move {
            run(&state, job).await;
            queued.fetch_sub(bytes, Ordering::AcqRel);
            drop(slot);
        });
    }
}

/// The share of one core the shadow thread may use, in percent (`[plugins]
/// shadow_cpu_percent`).
static CPU_PERCENT: AtomicUsize = AtomicUsize::new(10);

/// Sets the shadow thread's CPU share, in percent of one core (1 to 100).
pub fn set_cpu_percent(percent: u32) {
    CPU_PERCENT.store(percent.clamp(1, 100) as usize, Ordering::Relaxed);
}

/// The memory candidates may take and give back, in MiB per second (`[plugins]
/// shadow_memory_churn_mib_per_s`).
static CHURN_MIB_PER_S: AtomicUsize = AtomicUsize::new(crate::config::DEFAULT_SHADOW_MEMORY_CHURN_MIB_PER_S as usize);

/// Sets how much memory candidates may take and give back, in MiB per second (at
/// least 1).
pub fn set_memory_churn_mib_per_s(mib: u32) {
    CHURN_MIB_PER_S.store(mib.max(1) as usize, Ordering::Relaxed);
}

/// What the CPU bucket charges for a candidate's fault on top of the thread's own
/// clock. A fault drops the instance (after a trap it cannot be used again), so each
/// costs the next call a new instantiation, and an instantiation costs the process
/// more than the shadow thread's clock shows: mapping and protecting the instance's
/// memory goes through the kernel and the process's memory map, which the serving
/// threads share. A candidate that traps at every call ran instantiations back to
/// back and moved the serving p99 by 1.33× at the default share (every one of six
/// pairs at or above 1.0×), 0.91× at a fifth of it (docs/measurements.md). Charged,
/// such a candidate runs at most a call per `FAULT_CHARGE` of its share, and the rest
/// of its work is dropped and counted, as when it falls behind for any reason.
const FAULT_CHARGE: std::time::Duration = std::time::Duration::from_millis(5);

/// Everything charged for candidates' faults so far, in nanoseconds.
static FAULT_CHARGED_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// CPU time the shadow may use at once after a quiet spell.
const CPU_BURST: std::time::Duration = std::time::Duration::from_millis(50);
/// Memory churn the shadow may cause at once after a quiet spell: a few fresh
/// instances of an ordinary plugin, so starting a candidate is not paced.
const CHURN_BURST: u64 = 64 << 20;

/// What the shadow thread may spend, each a [`Bucket`] of its own:
/// - CPU time, by the thread's own clock (`CLOCK_THREAD_CPUTIME_ID`: every candidate
///   runs on that one thread, and the kernel's time for its page faults counts too).
///   Lowering the thread's priority alone is not enough: when the cores are busy, a
///   tenth of one is still a tenth taken from the serving threads.
/// - memory churn: the bytes candidate instances take and give back
///   ([`crate::plugin::sandbox::SHADOW_BUDGET`]). Mapping, first-touching and
///   unmapping linear memory costs more than the shadow thread's own CPU: every
///   unmap interrupts the other cores running the process to flush their TLBs, and
///   changing the memory map takes the process's map lock for writing, which stalls
///   the serving threads' own page faults and allocations. Candidates' memories and
///   stacks therefore stay mapped and are reused ([`crate::plugin::resident`]), which
///   removes that cost once the regions are warm; this bucket still bounds what is
///   left (regions made while the pool warms up or past what it keeps, and the
///   clearing of reused ones), since the CPU bucket sees only part of it.
static PACING: Mutex<Pacing> =
    Mutex::new(Pacing { cpu: Bucket::full(CPU_BURST.as_nanos() as u64), churn: Bucket::full(CHURN_BURST) });

struct Pacing {
    /// In nanoseconds of the shadow thread's CPU time.
    cpu: Bucket,
    /// In bytes taken plus bytes given back.
    churn: Bucket,
}

impl Pacing {
    /// How long to wait before the next job: until both buckets have paid what was
    /// spent past them. Called on the shadow thread (its CPU clock is read).
    fn pause(&mut self) -> std::time::Duration {
        let now = std::time::Instant::now();
        let cpu_per_s = CPU_PERCENT.load(Ordering::Relaxed) as u64 * (1_000_000_000 / 100);
        let churn_per_s = CHURN_MIB_PER_S.load(Ordering::Relaxed) as u64 * (1 << 20);
        let spent = thread_cpu().as_nanos() as u64 + FAULT_CHARGED_NS.load(Ordering::Relaxed);
        let cpu = self.cpu.pause_at(now, spent, cpu_per_s);
        let churn = self.churn.pause_at(now, crate::plugin::sandbox::SHADOW_BUDGET.churned(), churn_per_s);
        cpu.max(churn)
    }
}

/// A token bucket over something the shadow spends, counted by an ever-growing total
/// (CPU nanoseconds, bytes churned): it fills at a rate per second of wall clock, up
/// to its burst, and empties by what the total grew since the last look. A job may
/// overspend; the debt is then waited out before the next job starts.
struct Bucket {
    burst: u64,
    /// Wall clock and the total spent when last looked at.
    last: Option<(std::time::Instant, u64)>,
    /// What is left to spend.
    tokens: u64,
    /// No job starts before this (a debt being waited out), whichever route's.
    not_before: Option<std::time::Instant>,
}

impl Bucket {
    const fn full(burst: u64) -> Bucket {
        Bucket { burst, last: None, tokens: burst, not_before: None }
    }

    /// How long to wait before the next job, as of `now` with `spent` spent in all,
    /// filling at `per_s` a second: charges what was spent since the last look,
    /// credits the wall time passed, and when that leaves a debt, waits it out.
    fn pause_at(&mut self, now: std::time::Instant, spent: u64, per_s: u64) -> std::time::Duration {
        if let Some(wait) = self.not_before.and_then(|t| t.checked_duration_since(now)).filter(|w| !w.is_zero()) {
            return wait;
        }
        let per_s = per_s.max(1) as u128;
        let (credit, used) = match self.last.replace((now, spent)) {
            Some((wall, before)) => {
                (now.saturating_duration_since(wall).as_nanos() * per_s / 1_000_000_000, spent.saturating_sub(before))
            }
            None => (0, 0),
        };
        // Signed: a job may overspend, and the debt is waited out.
        let tokens =
            (self.tokens as i128 + credit.min(u64::MAX as u128) as i128 - used as i128).min(self.burst as i128);
        if tokens >= 0 {
            self.tokens = tokens as u64;
            return std::time::Duration::ZERO;
        }
        // Owed: wait until the rate has paid it back; the wait's credit is that
        // payment, so the next look counts from its end.
        let wait_ns = ((-tokens) as u128 * 1_000_000_000).div_ceil(per_s);
        let wait = std::time::Duration::from_nanos(wait_ns.min(u64::MAX as u128) as u64);
        self.tokens = 0;
        self.not_before = Some(now + wait);
        self.last = Some((now + wait, spent));
        wait
    }
}

/// CPU time the calling thread has used.
fn thread_cpu() -> std::time::Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if !ok {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// One job: the candidate's calls with the serving plugin's inputs, compared.
async fn run(state: &State, job: Job) {
    let Ok(candidate) = state.candidate.read().expect("candidate lock").clone() else { return };
    match job {
        Job::Decode { message, serving } => {
            let message_id = message.message_id.clone();
            let theirs = DecodeSide::of(&candidate.decode(message).await);
            let parts = serving.differences(&theirs);
            let at = Where { message_id: Some(message_id), ..Where::default() };
            state.record(Call::Decode, theirs.fault(), &parts, &at, &serving, &theirs);
        }
        Job::Deliver { entry, event, render, steps } => {
            let theirs = RenderSide::of(&candidate.render(event.clone()).await);
            let parts = render.differences(&theirs);
            let at = Where { entry: Some(entry), ..Where::default() };
            state.record(Call::Render, theirs.fault(), &parts, &at, &render, &theirs);
            for step in steps {
                let n = step.exchange.step;
                let theirs = ClassifySide::of(&candidate.classify(event.clone(), step.exchange, step.outcome).await);
                let parts = step.serving.differences(&theirs);
                let at = Where { entry: Some(entry), message_id: None, step: Some(n) };
                state.record(Call::Classify, theirs.fault(), &parts, &at, &step.serving, &theirs);
            }
        }
    }
}

impl State {
    /// Counts one comparison (or the candidate's fault) in the report and the metrics.
    fn record<S: Serialize>(
        &self,
        call: Call,
        fault: Option<&'static str>,
        parts: &[&'static str],
        at: &Where,
        ours: &S,
        theirs: &S,
    ) {
        use crate::telemetry::{PluginFaultLabels, RouteCall, ShadowPart};
        self.tally.lock().expect("shadow lock").record(call, fault, parts, at, ours, theirs);
        let route = self.route.to_string();
        if let Some(kind) = fault {
            FAULT_CHARGED_NS.fetch_add(FAULT_CHARGE.as_nanos() as u64, Ordering::Relaxed);
            let labels = PluginFaultLabels { route, call: call.as_str(), kind };
            self.metrics.shadow_faults.get_or_create(&labels).inc();
            return;
        }
        self.metrics.shadow_compared.get_or_create(&RouteCall { route: route.clone(), call: call.as_str() }).inc();
        for &part in parts {
            let labels = ShadowPart { route: route.clone(), call: call.as_str(), part };
            self.metrics.shadow_differences.get_or_create(&labels).inc();
        }
    }
}

/// One side of a sample, long texts cut at [`SAMPLE_BYTES`].
fn sample_side<S: Serialize>(side: &S) -> serde_json::Value {
    let mut value = serde_json::to_value(side).unwrap_or(serde_json::Value::Null);
    cut_strings(&mut value);
    value
}

fn cut_strings(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.len() > SAMPLE_BYTES => {
            let mut end = SAMPLE_BYTES;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push('…');
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(cut_strings),
        serde_json::Value::Object(map) => map.values_mut().for_each(cut_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> RequestSide {
        RequestSide {
            method: "POST".into(),
            path: path.into(),
            headers: vec![("a".into(), "1".into())],
            body: b"{}".to_vec(),
        }
    }

    #[test]
    fn requests_differ_by_the_parts_that_differ() {
        let a = RenderSide::Request(request("/a"));
        assert!(a.differences(&a.clone()).is_empty());
        assert_eq!(a.differences(&RenderSide::Request(request("/b"))), vec!["path"]);
        let mut other = request("/b");
        other.body = b"[]".to_vec();
        other.headers.clear();
        assert_eq!(a.differences(&RenderSide::Request(other)), vec!["path", "headers", "body"]);
        assert_eq!(a.differences(&RenderSide::Error { message: "no".into() }), vec!["answer"]);
    }

    #[test]
    fn dispositions_differ_by_kind_then_by_detail() {
        assert!(ClassifySide::Done.differences(&ClassifySide::Done).is_empty());
        assert_eq!(ClassifySide::Done.differences(&ClassifySide::Retry { hint_ms: None }), vec!["disposition"]);
        let park = |r: &str| ClassifySide::Park { reason: r.into() };
        assert_eq!(park("a").differences(&park("b")), vec!["reason"]);
        let next = |p: &str, s: &[u8]| ClassifySide::Next { request: request(p), state: s.to_vec() };
        assert_eq!(next("/a", b"1").differences(&next("/a", b"2")), vec!["next.state"]);
        assert_eq!(next("/a", b"1").differences(&next("/b", b"1")), vec!["next.path"]);
    }

    #[test]
    fn decoded_events_differ_by_field() {
        let event = |key: &str, body: &[u8]| DecodeSide::Event {
            event_type: "t".into(),
            correlation_key: key.into(),
            dedup_key: None,
            schema_version: None,
            body: body.to_vec(),
        };
        assert!(event("k", b"1").differences(&event("k", b"1")).is_empty());
        assert_eq!(event("k", b"1").differences(&event("j", b"2")), vec!["correlation_key", "body"]);
        assert_eq!(event("k", b"1").differences(&DecodeSide::Ignore { reason: "x".into() }), vec!["answer"]);
    }

    #[test]
    fn the_cpu_budget_waits_out_what_was_spent_past_the_share() {
        use std::time::{Duration, Instant};
        let ms = Duration::from_millis;
        let cpu = |d: Duration| d.as_nanos() as u64;
        // A tenth of a core: 100 ms of CPU per second.
        let tenth = 100_000_000;
        let t0 = Instant::now();
        let mut b = Bucket::full(cpu(CPU_BURST));
        assert_eq!(b.pause_at(t0, cpu(ms(0)), tenth), Duration::ZERO, "the first look starts the clocks");
        // 20 ms of CPU in 10 ms: paid from the burst (50 + 1 - 20 = 31 ms left).
        assert_eq!(b.pause_at(t0 + ms(10), cpu(ms(20)), tenth), Duration::ZERO);
        // 100 ms more in 10 ms: 31 + 1 - 100 = 68 ms owed, 680 ms at a tenth of a core.
        assert_eq!(b.pause_at(t0 + ms(20), cpu(ms(120)), tenth), ms(680));
        // Anyone looking meanwhile waits for the rest of it.
        assert_eq!(b.pause_at(t0 + ms(120), cpu(ms(120)), tenth), ms(580));
        // Paid: the next job goes, and the credit starts again from the wait's end.
        assert_eq!(b.pause_at(t0 + ms(700), cpu(ms(120)), tenth), Duration::ZERO);
        assert_eq!(b.tokens, 0);
        // A long quiet spell refills only up to the burst.
        assert_eq!(b.pause_at(t0 + ms(60_000), cpu(ms(120)), tenth), Duration::ZERO);
        assert_eq!(b.tokens, cpu(CPU_BURST));
    }

    #[test]
    fn the_churn_budget_waits_out_memory_taken_and_given_back_past_its_rate() {
        use std::time::{Duration, Instant};
        const MIB: u64 = 1 << 20;
        let ms = Duration::from_millis;
        // 32 MiB a second, what a hoarding candidate is paced to by default.
        let rate = 32 * MIB;
        let t0 = Instant::now();
        let mut b = Bucket::full(CHURN_BURST);
        assert_eq!(b.pause_at(t0, 0, rate), Duration::ZERO, "the first look starts the clocks");
        // Fresh instances of an ordinary plugin, 8 MiB in 125 ms: paid from the burst
        // (64 + 4 - 8 = 60 MiB left).
        assert_eq!(b.pause_at(t0 + ms(125), 8 * MIB, rate), Duration::ZERO);
        // Calls that grew 40 MiB and instances of 48 MiB dropped, 250 ms later:
        // 60 + 8 - 88 = 20 MiB owed, 625 ms at 32 MiB/s.
        assert_eq!(b.pause_at(t0 + ms(375), 96 * MIB, rate), ms(625));
        // Anyone looking meanwhile waits for the rest of it, whatever else was freed.
        assert_eq!(b.pause_at(t0 + ms(500), 100 * MIB, rate), ms(500));
        // Paid; what was given back during the wait is charged at the next look
        // (4 MiB from an empty bucket: an eighth of a second).
        assert_eq!(b.pause_at(t0 + ms(1000), 100 * MIB, rate), ms(125));
        assert_eq!(b.pause_at(t0 + ms(1125), 100 * MIB, rate), Duration::ZERO);
        assert_eq!(b.tokens, 0);
        // Sitting still costs nothing: a long quiet spell refills only up to the burst.
        assert_eq!(b.pause_at(t0 + ms(60_000), 100 * MIB, rate), Duration::ZERO);
        assert_eq!(b.tokens, CHURN_BURST);
    }

    #[test]
    fn sample_sides_are_cut() {
        let side = RenderSide::Request(RequestSide { body: vec![b'x'; 3 * SAMPLE_BYTES], ..request("/a") });
        let value = sample_side(&side);
        let body = value["body"].as_str().unwrap();
        assert!(body.len() <= SAMPLE_BYTES + 3 && body.ends_with('…'), "{}", body.len());
        assert_eq!(value["answer"], "request");
    }
}
