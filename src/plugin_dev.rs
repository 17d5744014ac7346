//! `inlet plugin test`: run a plugin's decode, render and classify on files, with the
//! same sandbox limits as in production, and print what each step produced. The loop
//! a product team lives in while writing a plugin; no store, broker or target needed.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::config::PluginLimits;
use crate::plugin::{Plugin, wit};

/// A recorded target answer, as written in a `--response` file:
/// `{"status": 400, "headers": {"content-type": "application/json"}, "body": {…} or "text"}`
/// or `{"transport_error": "timeout" | "connect" | "other", "message": "…"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFile {
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<serde_json::Value>,
    pub transport_error: Option<String>,
    #[serde(default)]
    pub message: String,
}

impl ResponseFile {
    fn outcome(&self) -> Result<wit::Outcome, String> {
        if let Some(kind) = &self.transport_error {
            let kind = match kind.as_str() {
                "timeout" => wit::TransportErrorKind::Timeout,
                "connect" => wit::TransportErrorKind::Connect,
                "other" => wit::TransportErrorKind::Other,
                other => return Err(format!("unknown transport_error `{other}`: use timeout, connect or other")),
            };
            return Ok(wit::Outcome::TransportError(wit::TransportError { kind, message: self.message.clone() }));
        }
        let status = self.status.ok_or("a response file needs `status` or `transport_error`")?;
        let body = match &self.body {
            None => Vec::new(),
            Some(serde_json::Value::String(s)) => s.clone().into_bytes(),
            Some(v) => v.to_string().into_bytes(),
        };
        let headers = self.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(wit::Outcome::Response(wit::Response { status, headers, body }))
    }
}

pub struct TestInput<'a> {
    pub plugin: &'a Path,
    pub message: Vec<u8>,
    pub attributes: Vec<(String, String)>,
    pub message_id: String,
    /// The target's answer to each step, in order.
    pub responses: Vec<ResponseFile>,
    pub limits: PluginLimits,
}

/// Runs the steps and returns the report; `Err` only when the plugin cannot be loaded
/// or the inputs are unusable. Plugin faults are part of the report.
pub async fn run(input: TestInput<'_>) -> Result<String, String> {
    let plugin: Arc<Plugin> = Plugin::load(input.plugin, input.limits, crate::plugin::default_cache_dir().as_deref())
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    let msg = wit::Message {
        data: input.message,
        attributes: input.attributes,
        message_id: input.message_id.clone(),
        publish_time: None,
        delivery_attempt: Some(1),
    };
    let event = match plugin.decode(msg).await {
        Err(fault) => {
            let _ = writeln!(
                out,
                "decode: plugin fault ({}): {fault}\n  → the message would be stored PARKED",
                fault.kind()
            );
            return Ok(out);
        }
        Ok(Err(e)) => {
            let _ = writeln!(out, "decode: error: {}\n  → the message would be stored PARKED", e.message);
            return Ok(out);
        }
        Ok(Ok(wit::Decoded::Ignore(reason))) => {
            let _ = writeln!(out, "decode: ignore: {reason}\n  → the message would be stored IGNORED");
            return Ok(out);
        }
        Ok(Ok(wit::Decoded::Event(ev))) => ev,
    };
    let _ = writeln!(out, "decode: event");
    let _ = writeln!(out, "  event-type:      {}", event.event_type);
    let _ = writeln!(out, "  correlation-key: {}", event.correlation_key);
    match &event.dedup_key {
        Some(k) => writeln!(out, "  dedup-key:       {k}"),
        None => writeln!(out, "  dedup-key:       (none: the broker message id `{}` is used)", input.message_id),
    }
    .ok();
    let _ = writeln!(out, "  schema-version:  {}", event.schema_version.as_deref().unwrap_or("(none)"));
    let _ = writeln!(out, "  body:            {}", show_body(&event.body));

    let mut rendered = event.clone();
    if rendered.dedup_key.is_none() {
        rendered.dedup_key = Some(input.message_id.clone());
    }
    let mut request = match plugin.render(rendered.clone()).await {
        Err(fault) => {
            let _ = writeln!(
                out,
                "render: plugin fault ({}): {fault}\n  → the attempt would count as failed",
                fault.kind()
            );
            return Ok(out);
        }
        Ok(Err(reason)) => {
            let _ = writeln!(out, "render: error: {reason}\n  → the entry would be PARKED");
            return Ok(out);
        }
        Ok(Ok(req)) => req,
    };
    let mut exchange = wit::Exchange { step: 1, state: Vec::new() };
    let mut responses = input.responses.into_iter();
    loop {
        let label = if exchange.step == 1 { "render".to_string() } else { format!("next (step {})", exchange.step) };
        let _ = writeln!(out, "{label}: {} {}", request.method, request.path);
        for (k, v) in &request.headers {
            let _ = writeln!(out, "  {k}: {v}");
        }
        let _ = writeln!(out, "  idempotency-key: {} (added by the host)", rendered.dedup_key.as_deref().unwrap_or(""));
        let _ = writeln!(out, "  body: {}", show_body(&request.body));

        let Some(response) = responses.next() else {
            let _ = writeln!(out, "classify: skipped (no --response given for step {})", exchange.step);
            return Ok(out);
        };
        let outcome = response.outcome()?;
        let described = crate::target::describe(&outcome);
        let verdict = match plugin.classify(rendered.clone(), exchange.clone(), outcome).await {
            Err(fault) => format!("plugin fault ({}): {fault}", fault.kind()),
            Ok(wit::Disposition::Next(next)) => {
                let _ = writeln!(out, "classify ({described}): next step, state {}", show_body(&next.state));
                request = next.request;
                exchange = wit::Exchange { step: exchange.step + 1, state: next.state };
                continue;
            }
            Ok(wit::Disposition::Done) => "done".to_string(),
            Ok(wit::Disposition::Retry(None)) => "retry (route backoff)".to_string(),
            Ok(wit::Disposition::Retry(Some(ms))) => format!("retry after {ms} ms"),
            Ok(wit::Disposition::NotYet(r)) => format!("not-yet: {r}"),
            Ok(wit::Disposition::Park(r)) => format!("park: {r}"),
            Ok(wit::Disposition::Ignore(r)) => format!("ignore: {r}"),
        };
        let _ = writeln!(out, "classify ({described}): {verdict}");
        return Ok(out);
    }
}

/// JSON bodies pretty on one line; other text as is; binary as a length.
fn show_body(body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v.to_string(),
        Err(_) => match std::str::from_utf8(body) {
            Ok(s) => s.to_string(),
            Err(_) => format!("({} bytes of binary)", body.len()),
        },
    }
}
