// The relay benchmark's peer: graphile-worker (a PostgreSQL job queue for Node.js)
// processing no-op jobs on the same PostgreSQL server as Inlet, so that the benchmark can
// print its rate beside Inlet's.
//
//   node graphile.mjs --db postgres://postgres@127.0.0.1:5432/DBNAME --jobs N
//                     [--keys K] [--concurrency C] [--batch] [--modules DIR] ...
//
// The database must exist and should be empty (the caller makes a fresh one): this runs
// graphile-worker's migrations in it, enqueues N jobs of the task `noop` (not timed),
// then times one worker (run() with concurrency C) from its start until every job is
// done (graphile-worker deletes a job once it completed), and stops it. With --keys K > 0 job i goes to graphile-worker's serial queue
// `key-(i % K)` (at most one job of a queue runs at a time: its analogue of Inlet's
// per-key order); K = 0 puts the jobs in no queue.
//
// graphile-worker is loaded from the node_modules folder given by --modules or the
// INLET_PEER_MODULES environment variable (scripts/ensure-graphile prints it), else from
// node_modules next to this file. ESM ignores NODE_PATH, hence createRequire.
//
// Output: on stdout, {"phase":"timed"} as the timed part starts and {"phase":"untimed"} as
// it ends (so a caller can measure what the machine spent in between), then one JSON line,
//   {"peer":"graphile-worker","version":"0.18.0","jobs":N,"keys":K,"concurrency":C,
//    "batch":true,"seconds":S,"jobs_per_s":R}
// everything else goes to stderr. Exits 1 without printing a result when the jobs did not
// all complete within --timeout seconds, when a job failed, or on any error; 2 on bad
// arguments.

import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { EventEmitter } from "node:events";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const usage = `usage: node graphile.mjs --db URL --jobs N [--keys K] [--concurrency C] [--batch]
  [--modules DIR] [--timeout SECONDS] [--poll-interval MS] [--pool N]
  [--local-queue N] [--complete-delay MS] [--chunk N] [--fifo] [--verbose]

  --db URL             PostgreSQL connection string of a fresh, empty database
  --jobs N             number of no-op jobs to enqueue and process
  --keys K             serial queues key-0 .. key-(K-1), job i in key-(i % K); 0: no queue (default 0)
  --concurrency C      jobs run at once by the worker (concurrentJobs; default 32)
  --batch              fetch jobs in batches (localQueue) and complete them in batches
                       (completeJobBatchDelay, failJobBatchDelay)
  --local-queue N      localQueue.size with --batch (default: 2000 without keys,
                       else K / 4 up to 2000; at least C)
  --complete-delay MS  completeJobBatchDelay and failJobBatchDelay with --batch (default 0)
  --poll-interval MS   how long an idle worker (or local queue) waits before asking
                       again (pollInterval; default 10 with --batch, else 100)
  --pool N             maxPoolSize (default: max(10, C + 2), as graphile-worker advises)
  --chunk N            jobs per addJobs call when enqueueing (default 10000)
  --fifo               give job i run_at = (a past instant) + i ms, so that a serial queue
                       runs its jobs in enqueue order (see below)
  --modules DIR        node_modules folder holding graphile-worker (or INLET_PEER_MODULES)
  --timeout SECONDS    give up when the jobs are not all done this long after the start (default 300)
  --verbose            graphile-worker's info and debug logs too (stderr)`;

function fail(message, code = 1) {
    process.stderr.write(`graphile.mjs: ${message}\n`);
    process.exit(code);
}

let parsed;
try {
    parsed = parseArgs({
        options: {
            db: { type: "string" },
            jobs: { type: "string" },
            keys: { type: "string", default: "0" },
            concurrency: { type: "string", default: "32" },
            batch: { type: "boolean", default: false },
            "local-queue": { type: "string" },
            "complete-delay": { type: "string", default: "0" },
            "poll-interval": { type: "string" },
            pool: { type: "string" },
            chunk: { type: "string", default: "10000" },
            fifo: { type: "boolean", default: false },
            modules: { type: "string" },
            timeout: { type: "string", default: "300" },
            verbose: { type: "boolean", default: false },
            help: { type: "boolean", default: false },
        },
        strict: true,
        allowPositionals: false,
    }).values;
} catch (e) {
    fail(`${e.message}\n${usage}`, 2);
}
if (parsed.help) {
    process.stderr.write(`${usage}\n`);
    process.exit(0);
}

// A whole number >= min, or exit 2.
function integer(name, min) {
    const text = parsed[name];
    if (text === undefined) fail(`--${name} is required\n${usage}`, 2);
    if (!/^\d+$/.test(text) || Number(text) < min) fail(`--${name} must be a whole number >= ${min}, not '${text}'`, 2);
    return Number(text);
}

if (!parsed.db) fail(`--db is required\n${usage}`, 2);
const jobs = integer("jobs", 1);
const keys = integer("keys", 0);
const concurrency = integer("concurrency", 1);
const batch = parsed.batch;
// Measured here: with --batch the one local queue sleeps pollInterval whenever a fetch
// comes back short (serial queues still locked), so short is better. Without it every
// worker fetches on its own; with serial queues a fetch locks every free queue row and
// concurrent fetches skip them and find nothing, so 10 ms multiplied those empty fetches
// (10 per job at K = 1000) and 100 ms ran 2.5 times faster.
const pollInterval = parsed["poll-interval"] === undefined ? (batch ? 10 : 100) : integer("poll-interval", 1);
const chunk = integer("chunk", 1);
const timeoutSeconds = integer("timeout", 1);
const maxPoolSize = parsed.pool === undefined ? Math.max(10, concurrency + 2) : integer("pool", 2);
// The default localQueue.size gave the best rates measured here (2 cores, PostgreSQL 15).
// Without keys, the bigger the better up to ~2000. With serial queues one fetch returns at
// most one job per unlocked queue, so a size near K comes back short and the local queue
// then sleeps pollInterval; about K / 4 kept it fed.
const localQueueSize =
    parsed["local-queue"] === undefined
        ? Math.max(concurrency, keys === 0 ? 2000 : Math.min(2000, Math.floor(keys / 4)))
        : integer("local-queue", 2);
const completeDelay = integer("complete-delay", 0);
const schema = "graphile_worker";

// graphile-worker reads NO_LOG_SUCCESS when it is loaded: without it every completed job
// costs an info log line (formatted even when the logger drops it).
process.env.NO_LOG_SUCCESS = "1";

const modules = resolve(
    parsed.modules ?? process.env.INLET_PEER_MODULES ?? join(dirname(fileURLToPath(import.meta.url)), "node_modules"),
);
let gw;
let version;
try {
    // Resolves as a file directly inside `modules` would, i.e. from `modules` itself.
    const require = createRequire(join(modules, "inlet-peer-resolve.cjs"));
    const entry = require.resolve("graphile-worker");
    gw = await import(pathToFileURL(entry).href);
    // The package's "exports" hides package.json from require; read the file (next to dist/).
    version = JSON.parse(readFileSync(join(dirname(entry), "..", "package.json"), "utf8")).version;
} catch (e) {
    fail(`cannot load graphile-worker from ${modules} (run scripts/ensure-graphile; pass its node_modules folder with --modules or INLET_PEER_MODULES): ${e.message}`);
}

// graphile-worker's logs go to stderr: warnings and errors, or all with --verbose.
const logger = new gw.Logger((scope) => (level, message) => {
    if (parsed.verbose || level === "error" || level === "warning") {
        process.stderr.write(`[graphile-worker${scope.label ? ` ${scope.label}` : ""}] ${level}: ${message}\n`);
    }
});

const settings = {
    connectionString: parsed.db,
    schema,
    logger,
    maxPoolSize,
};

let utils;
try {
    await main();
} catch (e) {
    fail(`error: ${e.message ?? e}`);
}

async function main() {
    // Migrations, then the jobs. makeWorkerUtils runs the migrations already; the explicit
    // migrate() keeps that step visible.
    utils = await gw.makeWorkerUtils(settings);
    await utils.migrate();
    const queued = await count();
    if (queued !== 0) fail(`the database already holds ${queued} graphile-worker jobs; give a fresh database`);

    const enqueueStart = performance.now();
    // graphile-worker's fetch orders jobs by (priority, run_at) only (dist/sql/getJobs.js;
    // the batched fetch then keeps one job per queue without an id tie-break). Jobs of one
    // add_jobs call share run_at = now(), so a serial queue runs them one at a time but not
    // always in enqueue order. --fifo makes run_at distinct and increasing (all in the past).
    const runAtBase = Date.now() - jobs - 60_000;
    for (let first = 0; first < jobs; first += chunk) {
        const specs = [];
        for (let i = first; i < Math.min(first + chunk, jobs); i++) {
            const spec = { identifier: "noop", payload: {} };
            if (keys > 0) spec.queueName = `key-${i % keys}`;
            if (parsed.fifo) spec.runAt = new Date(runAtBase + i);
            specs.push(spec);
        }
        // One add_jobs() statement per chunk.
        await utils.addJobs(specs);
    }
    // Fresh tables have no statistics yet; a long-lived queue's would. Not timed.
    await utils.withPgClient((client) => client.query(`analyze ${schema}._private_jobs, ${schema}._private_job_queues, ${schema}._private_tasks`));
    const enqueued = await count();
    if (enqueued !== jobs) fail(`enqueued ${jobs} jobs but the database holds ${enqueued}`);
    process.stderr.write(
        `graphile.mjs: enqueued ${jobs} jobs (${keys > 0 ? `${keys} serial queues` : "no queue"}) in ${((performance.now() - enqueueStart) / 1000).toFixed(2)} s (not timed)\n`,
    );

    // The worker's settings. Batching: localQueue fetches (and locks) `size` jobs per query
    // and hands them to the worker's concurrent slots; completeJobBatchDelay and
    // failJobBatchDelay >= 0 gather completions / failures made within that many ms into one
    // statement (-1, the default, is one statement per job).
    const worker = {
        ...settings,
        concurrentJobs: concurrency,
        pollInterval,
        events: new EventEmitter(),
        ...(batch ? { localQueue: { size: localQueueSize }, completeJobBatchDelay: completeDelay, failJobBatchDelay: completeDelay } : {}),
    };
    process.stderr.write(
        `graphile.mjs: graphile-worker ${version}, concurrency ${concurrency}, maxPoolSize ${maxPoolSize}, pollInterval ${pollInterval} ms, ${
            batch ? `localQueue.size ${localQueueSize}, completeJobBatchDelay ${completeDelay} ms, failJobBatchDelay ${completeDelay} ms` : "no batching"
        }\n`,
    );

    // Counted from the worker's events: successes, failures, and, per serial queue, the job
    // running (at most one may) and the highest job id started (enqueue order is id order).
    let completed = 0;
    let failed = 0;
    let overlaps = 0;
    let outOfOrder = 0;
    const running = new Map();
    const lastStarted = new Map();
    let firstStart;
    let allCompleted;
    let jobFailed;
    const allCompletedPromise = new Promise((resolve, reject) => ((allCompleted = resolve), (jobFailed = reject)));
    worker.events.on("job:start", ({ job }) => {
        firstStart ??= performance.now();
        const queue = job.job_queue_id;
        if (queue == null) return;
        if (running.has(queue)) overlaps++;
        running.set(queue, job.id);
        const id = BigInt(job.id);
        if (lastStarted.has(queue) && id < lastStarted.get(queue)) outOfOrder++;
        if (!lastStarted.has(queue) || id > lastStarted.get(queue)) lastStarted.set(queue, id);
    });
    // How the jobs were fetched: batches of the local queue, and fetches that found nothing
    // (each followed by a pollInterval sleep unless a new-job notification came).
    let fetches = 0;
    let emptyFetches = 0;
    worker.events.on("localQueue:getJobs:complete", ({ jobs }) => {
        fetches++;
        if (jobs.length === 0) emptyFetches++;
    });
    // Without the local queue each worker fetches for itself. (With it, this event only
    // comes as the workers stop.)
    if (!batch) worker.events.on("worker:getJob:empty", () => emptyFetches++);
    worker.events.on("job:complete", ({ job, error }) => {
        if (job.job_queue_id != null && running.get(job.job_queue_id) === job.id) running.delete(job.job_queue_id);
        if (error) {
            // A no-op cannot fail; graphile-worker would retry it minutes later: give up now.
            failed++;
            jobFailed(new Error(`job ${job.id} failed: ${error.message ?? error}`));
        } else if (++completed === jobs) {
            allCompleted();
        }
    });

    let timer;
    const deadline = new Promise((_, reject) => {
        timer = setTimeout(
            () => reject(new Error(`timeout: ${completed} of ${jobs} jobs completed within ${timeoutSeconds} s`)),
            timeoutSeconds * 1000,
        );
    });
    // Handled where it is raced; this keeps a late rejection from being "unhandled".
    deadline.catch(() => {});

    // The caller measures the CPU spent between these two lines.
    process.stdout.write(`${JSON.stringify({ phase: "timed" })}\n`);
    const start = performance.now();
    const runner = await gw.run({
        preset: { worker },
        taskList: {
            // The job itself does nothing: the benchmark measures the queue.
            noop: () => {},
        },
        // No crontab (otherwise ./crontab is read).
        parsedCronItems: [],
        // The caller's signals end this process; graphile-worker's handlers would delay that.
        noHandleSignals: true,
    });
    let seconds;
    let stopping = false;
    // The worker ending by itself (an error, or a clean exit) before we stop it is a failure.
    const workerEnded = runner.promise.then(
        () => {
            if (!stopping) throw new Error(`the worker stopped after ${completed} of ${jobs} jobs`);
        },
        (e) => {
            if (!stopping) throw new Error(`the worker failed after ${completed} of ${jobs} jobs: ${e.message ?? e}`);
        },
    );
    workerEnded.catch(() => {});
    try {
        await Promise.race([allCompletedPromise, deadline, workerEnded]);
        // job:complete fires before the completion is written (at once, or batched after
        // completeJobBatchDelay): done is when the jobs table is empty.
        while ((await count()) !== 0) {
            await Promise.race([new Promise((r) => setTimeout(r, 2)), deadline]);
        }
        seconds = (performance.now() - start) / 1000;
        process.stdout.write(`${JSON.stringify({ phase: "untimed" })}\n`);
        clearTimeout(timer);
        if (failed > 0) throw new Error(`${failed} jobs failed`);
        process.stderr.write(
            `graphile.mjs: first job started ${(firstStart - start).toFixed(0)} ms after run() was called (timed)\n`,
        );
        if (completed !== jobs) throw new Error(`${completed} completions for ${jobs} jobs`);
    } catch (e) {
        process.stderr.write(`graphile.mjs: ${e.message}\n`);
        stopping = true;
        await Promise.race([runner.kill().catch(() => {}), new Promise((r) => setTimeout(r, 5000))]);
        process.exit(1);
    }

    stopping = true;
    await runner.stop();
    await workerEnded;
    await utils.release();

    process.stderr.write(
        `graphile.mjs: ${batch ? `${fetches} local-queue fetches, ` : ""}${emptyFetches} fetches found no job\n`,
    );
    if (keys > 0) {
        process.stderr.write(
            `graphile.mjs: serial queues: ${overlaps} starts while a job of the same queue ran, ${outOfOrder} starts before an older job of the same queue\n`,
        );
    }
    const result = {
        peer: "graphile-worker",
        version,
        jobs,
        keys,
        concurrency,
        batch,
        seconds: Number(seconds.toFixed(3)),
        jobs_per_s: Number((jobs / seconds).toFixed(1)),
    };
    process.stdout.write(`${JSON.stringify(result)}\n`);
}

// Jobs in graphile-worker's table (its public view).
async function count() {
    const { rows } = await utils.withPgClient((client) => client.query(`select count(*)::int as n from ${schema}.jobs`));
    return rows[0].n;
}
