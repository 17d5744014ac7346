//! What the fakes that record requests share: the correlation key a request body is
//! for, and the requests in flight per key (two at once for one key is an overlap).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The correlation key of a request body in Camunda's `correlationKeys` shape (as the
/// work-order plugin renders it): the value of its single entry (strings as-is, other
/// JSON values printed); several entries are joined as sorted `name=value` pairs with
/// `&`; empty if there is none.
pub(crate) fn correlation_key(body: &serde_json::Value) -> String {
    let Some(keys) = body.get("correlationKeys").and_then(|v| v.as_object()) else {
        return String::new();
    };
    let value_text = |v: &serde_json::Value| {
        let v = v.get("value").unwrap_or(v);
        match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    if keys.len() == 1 {
        let (_, v) = keys.iter().next().expect("one key");
        return value_text(v);
    }
    let mut pairs: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={}", value_text(v))).collect();
    pairs.sort();
    pairs.join("&")
}

/// Requests in flight per key at a fake, and what that showed: shared by
/// [`FakeCamunda`](crate::camunda::FakeCamunda) and
/// [`RecordingTarget`](crate::recording_target::RecordingTarget).
#[derive(Default)]
pub(crate) struct KeysInFlight {
    now: HashMap<String, usize>,
    /// The most ever in flight at once for one key.
    pub(crate) max: usize,
    /// Keys that had a second request arrive while one was in flight (one per overlap).
    pub(crate) overlaps: Vec<String>,
    /// Requests in flight now, whatever their key.
    all_now: usize,
    /// The most requests ever in flight at once, whatever their keys.
    pub(crate) all_max: usize,
}

/// A fake's state that holds a [`KeysInFlight`].
pub(crate) trait HasKeysInFlight: Send + 'static {
    fn keys(&mut self) -> &mut KeysInFlight;
}

/// Marks a request in flight for its key until dropped (also when the client goes away
/// and the handler is cancelled).
pub(crate) struct InFlight<S: HasKeysInFlight> {
    state: Arc<Mutex<S>>,
    key: String,
}

impl<S: HasKeysInFlight> InFlight<S> {
    /// Counts a request for `key` in, with `st` the locked `state`.
    pub(crate) fn enter(state: &Arc<Mutex<S>>, st: &mut S, key: &str) -> InFlight<S> {
        let keys = st.keys();
        let n = keys.now.entry(key.to_owned()).or_insert(0);
        *n += 1;
        let n = *n;
        if n > 1 {
            keys.overlaps.push(key.to_owned());
        }
        keys.max = keys.max.max(n);
        keys.all_now += 1;
        keys.all_max = keys.all_max.max(keys.all_now);
        InFlight { state: Arc::clone(state), key: key.to_owned() }
    }
}

impl<S: HasKeysInFlight> Drop for InFlight<S> {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let keys = st.keys();
        keys.all_now -= 1;
        if let Some(n) = keys.now.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                keys.now.remove(&self.key);
            }
        }
    }
}
