//! Sources: where messages come from. Each hands messages to [`crate::ingest`] and
//! acks only what it returned `Ok` for.

pub mod ack_journal;
pub mod outbox;
pub mod pull;
pub mod push;
pub mod push_auth;
