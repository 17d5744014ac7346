//! The one place that decides what happens to an entry after an attempt.
//!
//! Pure: given the route's policies, the entry's history, the plugin's disposition,
//! the time and a random source, it returns the [`Settlement`] to record. The clock
//! and the randomness are arguments so tests can pin both.

use std::time::Duration;

use crate::clock::Millis;
use crate::config::{NotYetPolicy, RetryPolicy};
use crate::inbox::Settlement;

/// What the attempt came to, in the host's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    Done,
    /// A technical failure; `hint` is the plugin's suggested delay.
    Retry {
        error: String,
        hint: Option<Duration>,
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
}

impl Disposition {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Disposition::Done => "done",
            Disposition::Retry { .. } => "retry",
            Disposition::NotYet { .. } => "not_yet",
            Disposition::Park { .. } => "park",
            Disposition::Ignore { .. } => "ignore",
        }
    }
}

/// The delay before attempt `attempts + 1`, after `attempts` failed ones (≥ 1):
/// `initial * multiplier^(attempts-1)`, spread by ± jitter, never above `max`.
pub fn backoff(policy: &RetryPolicy, attempts: u32, rng: &mut fastrand::Rng) -> Duration {
    let exp = attempts.saturating_sub(1).min(64) as i32;
    let base = (policy.initial.as_secs_f64() * policy.multiplier.powi(exp)).min(policy.max.as_secs_f64());
    let spread = 1.0 + policy.jitter * (rng.f64() * 2.0 - 1.0);
    Duration::from_secs_f64((base * spread).clamp(0.0, policy.max.as_secs_f64()))
}

pub struct Decision<'a> {
    pub retry: &'a RetryPolicy,
    pub not_yet: &'a NotYetPolicy,
    /// Attempts made so far, including the one just finished.
    pub attempts: u32,
    /// When this run's first NOT-YET answer came, if one has.
    pub not_yet_since: Option<Millis>,
    pub now: Millis,
}

impl Decision<'_> {
    pub fn settle(&self, d: Disposition, rng: &mut fastrand::Rng) -> Settlement {
        match d {
            Disposition::Done => Settlement::Done,
            Disposition::Ignore { reason } => Settlement::Ignored { reason },
            Disposition::Park { reason } => Settlement::Parked { error: reason },
            Disposition::Retry { error, hint } => {
                if self.attempts >= self.retry.max_attempts {
                    return Settlement::Parked { error: format!("gave up after {} attempts: {error}", self.attempts) };
                }
                let delay = match hint {
                    Some(h) => h.min(self.retry.max),
                    None => backoff(self.retry, self.attempts, rng),
                };
                Settlement::Retry { at: self.now + delay.as_millis() as Millis, error, not_yet_since: None }
            }
            Disposition::NotYet { reason } => {
                // From the first not-yet answer of this run: time spent waiting behind
                // older entries of the key, or before a requeue, does not count.
                let since = self.not_yet_since.unwrap_or(self.now);
                let deadline = since + self.not_yet.deadline.as_millis() as Millis;
                if self.now >= deadline {
                    return Settlement::Parked {
                        error: format!(
                            "target still not ready after the deadline of {}: {reason}",
                            humantime::format_duration(self.not_yet.deadline)
                        ),
                    };
                }
                let delay = backoff(self.retry, self.attempts, rng).min(self.not_yet.max_interval);
                // The last try happens at the deadline, not after it.
                let at = (self.now + delay.as_millis() as Millis).min(deadline);
                Settlement::Retry { at, error: format!("not yet: {reason}"), not_yet_since: Some(since) }
            }
        }
    }
}
