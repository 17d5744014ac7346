//! Support shared by Inlet's integration tests and benchmarks, one module per concern,
//! built once and linked into each of them (the root package's dev-dependency, on the
//! same `inlet` library the tests use).
//!
//! Real services, really started: [`pg::TestPg`] gives every test its own fresh
//! PostgreSQL database, [`camunda::FakeCamunda`] is a real HTTP server playing Camunda
//! 7's message correlation endpoint, [`paths::plugin_path`] points at the real compiled
//! plugins. A test that needs a service it cannot reach fails loudly; nothing is skipped.
//!
//! Waiting is done only through [`wait::wait_until`] / [`wait::wait_for`]
//! ([`wait::wait_while_progressing`] for work whose pace is not ours,
//! [`wait::poll_blocking`] where awaiting is impossible): poll with a deadline, never a
//! fixed sleep.

pub mod camunda;
pub mod emulator;
pub mod in_process;
pub mod metrics;
pub mod object_store;
pub mod paths;
mod per_key;
pub mod pg;
pub mod pg_cluster;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod push;
pub mod py_pubsub;
pub mod recording_target;
pub mod utc;
pub mod wait;
