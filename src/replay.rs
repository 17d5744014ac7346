//! `inlet plugin replay`: a candidate plugin checked against real history before a
//! single live message. Stored entries of a route run through the candidate and the
//! serving version with the same inputs, and the answers are compared as the shadow
//! compares them ([`crate::shadow`]): each entry's raw message through `decode`, its
//! stored event through `render` (as the relay renders it), and each request recorded
//! in its attempt history through `classify`.
//!
//! Nothing is sent and nothing is written: entries are read, plugins are called.
//!
//! The attempt history keeps a request's status (or why no answer came), not the
//! target's headers or body, so `classify` is given the recorded status with no
//! headers and an empty body; both versions get exactly that. A multi-step exchange
//! is followed with the state the serving version hands over at each step.

use std::sync::Arc;

use serde::Serialize;

use crate::clock::Millis;
use crate::inbox::failures::RequestRecord;
use crate::inbox::{Entry, ListFilter, Store, StoreError};
use crate::plugin::{Plugin, wit};
use crate::shadow::{Call, ClassifySide, Counts, DecodeSide, RenderSide, Sample, Tally, Where};

/// Which entries to replay.
#[derive(Debug, Clone)]
pub struct Selection {
    pub route: String,
    /// Entries received at or after this time only.
    pub since: Option<Millis>,
    /// The newest this many entries (of those since `since`).
    pub limit: u32,
}

/// One entry whose answers differed.
#[derive(Debug, Clone, Serialize)]
pub struct Differing {
    pub entry: i64,
    pub call: Call,
    pub step: Option<u32>,
    pub parts: Vec<String>,
}

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub route: String,
    pub serving_sha256: String,
    pub candidate_sha256: String,
    /// Entries replayed.
    pub entries: usize,
    pub counts: Counts,
    /// Every difference, in entry order.
    pub differences: Vec<Differing>,
    /// The most recent differences with both sides.
    pub samples: Vec<Sample>,
}

/// Replays the selected entries through both versions.
pub async fn run(
    store: &dyn Store,
    serving: &Arc<Plugin>,
    candidate: &Arc<Plugin>,
    selection: &Selection,
) -> Result<ReplayReport, StoreError> {
    let filter = ListFilter {
        route: Some(selection.route.clone()),
        limit: selection.limit,
        newest_first: true,
        ..ListFilter::default()
    };
    let mut entries = store.list(&filter).await?;
    entries.retain(|e| selection.since.is_none_or(|since| e.received_at >= since));
    entries.reverse();
    let mut tally = Tally::new();
    let mut differences = Vec::new();
    for entry in &entries {
        let attempts = store.attempts(entry.id).await?;
        let requests: Vec<&RequestRecord> = attempts.iter().flat_map(|a| a.requests.iter()).collect();
        for (call, step, parts) in replay_entry(serving, candidate, entry, &requests, &mut tally).await {
            differences.push(Differing { entry: entry.id, call, step, parts });
        }
    }
    Ok(ReplayReport {
        route: selection.route.clone(),
        serving_sha256: serving.digest().to_string(),
        candidate_sha256: candidate.digest().to_string(),
        entries: entries.len(),
        counts: tally.counts,
        differences,
        samples: tally.samples.into_iter().collect(),
    })
}

/// The comparisons of one entry; returns the ones that differed.
async fn replay_entry(
    serving: &Plugin,
    candidate: &Plugin,
    entry: &Entry,
    requests: &[&RequestRecord],
    tally: &mut Tally,
) -> Vec<(Call, Option<u32>, Vec<String>)> {
    let mut found = Found { tally, entry, differing: Vec::new() };

    let message = wit::Message {
        data: entry.raw_data.clone(),
        attributes: entry.attributes.clone(),
        message_id: entry.message_id.clone(),
        publish_time: entry.publish_time.clone(),
        delivery_attempt: entry.delivery_attempt.map(|a| a.max(0) as u32),
    };
    let ours = DecodeSide::of(&serving.decode(message.clone()).await);
    let theirs = DecodeSide::of(&candidate.decode(message).await);
    found.compare(Call::Decode, theirs.fault(), ours.differences(&theirs), None, &ours, &theirs);

    // The event as the relay hands it to `render`: the stored one.
    let Some(decoded) = entry.decoded() else { return found.differing };
    let event = wit::Event {
        event_type: decoded.event_type,
        correlation_key: decoded.correlation_key,
        dedup_key: Some(entry.dedup_key.clone()),
        body: decoded.body,
        schema_version: decoded.schema_version,
    };
    let ours = RenderSide::of(&serving.render(event.clone()).await);
    let theirs = RenderSide::of(&candidate.render(event.clone()).await);
    found.compare(Call::Render, theirs.fault(), ours.differences(&theirs), None, &ours, &theirs);

    let mut state = Vec::new();
    for request in requests {
        let exchange =
            wit::Exchange { step: request.step, state: if request.step > 1 { state.clone() } else { Vec::new() } };
        let outcome = recorded_outcome(request);
        let ours = ClassifySide::of(&serving.classify(event.clone(), exchange.clone(), outcome.clone()).await);
        let theirs = ClassifySide::of(&candidate.classify(event.clone(), exchange, outcome).await);
        let step = Some(request.step);
        found.compare(Call::Classify, theirs.fault(), ours.differences(&theirs), step, &ours, &theirs);
        if let ClassifySide::Next { state: next, .. } = &ours {
            state = next.clone();
        }
    }
    found.differing
}

/// The comparisons of one entry as they are made.
struct Found<'a> {
    tally: &'a mut Tally,
    entry: &'a Entry,
    differing: Vec<(Call, Option<u32>, Vec<String>)>,
}

impl Found<'_> {
    fn compare<S: Serialize>(
        &mut self,
        call: Call,
        fault: Option<&'static str>,
        parts: Vec<&'static str>,
        step: Option<u32>,
        ours: &S,
        theirs: &S,
    ) {
        let at = Where { entry: Some(self.entry.id), message_id: Some(self.entry.message_id.clone()), step };
        if self.tally.record(call, fault, &parts, &at, ours, theirs) {
            self.differing.push((call, step, parts.iter().map(|p| p.to_string()).collect()));
        }
    }
}

/// The target's answer as the attempt history recorded it: the status alone, or the
/// transport error (its kind read back from the recorded text).
fn recorded_outcome(request: &RequestRecord) -> wit::Outcome {
    match (request.status, &request.error) {
        (Some(status), _) => wit::Outcome::Response(wit::Response { status, headers: Vec::new(), body: Vec::new() }),
        (None, error) => {
            let message = error.clone().unwrap_or_default();
            let kind = if message.starts_with("timeout") {
                wit::TransportErrorKind::Timeout
            } else if message.starts_with("connect") {
                wit::TransportErrorKind::Connect
            } else {
                wit::TransportErrorKind::Other
            };
            wit::Outcome::TransportError(wit::TransportError { kind, message })
        }
    }
}
