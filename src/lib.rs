//! Inlet: a WebAssembly-pluggable event routing engine.
//!
//! ```text
//! source ──► ingest ──► plugin.decode ──► inbox.insert (commit) ──► ack
//!                          (malformed / plugin fault ─► insert PARKED ─► ack)
//!                          (insert fails ─► nack: the broker redelivers)
//!
//! relay:  inbox.claim ─► plugin.render ─► target.deliver ─► plugin.classify
//!             ─► inbox.settle(done | retry | not-yet | park | ignore)
//! ```
//!
//! The inbox is the only hand-over between the two halves: the receiver never
//! delivers and the relay never acks. See `ARCHITECTURE.md` for the code map.

pub mod admin;
pub mod app;
pub mod build_info;
pub mod claim_check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod delivery;
pub mod guesses;
pub mod inbox;
pub mod ingest;
pub mod operate;
pub mod plugin;
pub mod plugin_dev;
pub mod plugin_new;
pub mod pubsub_client;
pub mod redact;
pub mod relay;
pub mod reload;
pub mod replay;
pub mod rollout;
pub mod routing;
pub mod rules;
pub mod server;
pub mod shadow;
pub mod shared;
pub mod source;
pub mod telemetry;
