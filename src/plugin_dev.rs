//! `inlet plugin test`: run a plugin's decode, render and classify on files, with the
//! same sandbox limits as in production (a route's own limits and output rules with
//! `--route`), and report what each step produced, as text or JSON. The loop a product
//! team lives in while writing a plugin; no store, broker or target needed.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::config::{PluginLimits, RouteConfig};
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
    /// The route whose output rules apply (`--route`); none: no rules are checked.
    pub route: Option<&'a RouteConfig>,
}

/// What one run of the steps produced.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The broker message id the run used (the dedup key unless the plugin names one).
    pub message_id: String,
    pub decode: Decode,
    /// Why no request was sent after a decoded event, if none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub render_failed: Option<Failure>,
    /// Each request of the exchange, with the target's answer and the plugin's verdict.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// What Inlet would do with the message or entry after these steps.
    pub conclusion: String,
    /// The plugin failed (a decode error, a fault, a refused answer): the command
    /// exits non-zero.
    pub failed: bool,
}

/// What `decode` answered.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Decode {
    Event {
        event_type: String,
        correlation_key: String,
        /// The plugin's dedup key; `None`: the broker message id is used.
        dedup_key: Option<String>,
        schema_version: Option<String>,
        body: Body,
    },
    Ignore {
        reason: String,
    },
    Error {
        reason: String,
    },
    Fault {
        kind: &'static str,
        message: String,
    },
    /// An event that breaks one of the route's output rules.
    Refused {
        rule: &'static str,
        reason: String,
    },
}

/// A render or classify call that did not give an answer Inlet can use.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Failure {
    /// The plugin said no (render's error).
    Error {
        reason: String,
    },
    Fault {
        kind: &'static str,
        message: String,
    },
    /// The request breaks one of the route's output rules; it would not be sent.
    Refused {
        rule: &'static str,
        reason: String,
    },
}

#[derive(Debug, Serialize)]
pub struct Step {
    pub step: u32,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Added by the host: the entry's dedup key.
    pub idempotency_key: String,
    pub body: Body,
    /// `None`: no `--response` was given for this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
}

#[derive(Debug, Serialize)]
pub struct Answer {
    /// The target's answer as Inlet describes it in errors.
    pub target: String,
    pub verdict: Verdict,
}

/// What `classify` made of the target's answer.
#[derive(Debug, Serialize)]
#[serde(tag = "disposition", rename_all = "snake_case")]
pub enum Verdict {
    Next { state: Body },
    Done,
    Retry { after_ms: Option<u64> },
    NotYet { reason: String },
    Park { reason: String },
    Ignore { reason: String },
    Fault { kind: &'static str, message: String },
}

/// Bytes as a reader wants them: parsed JSON, else text, else base64.
#[derive(Debug, Serialize)]
pub struct Body {
    pub bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

impl Body {
    fn of(bytes: &[u8]) -> Body {
        let mut body = Body { bytes: bytes.len(), json: None, text: None, base64: None };
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            body.json = Some(v);
        } else if let Ok(s) = std::str::from_utf8(bytes) {
            body.text = Some(s.to_string());
        } else {
            body.base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        body
    }
}

impl std::fmt::Display for Body {
    /// JSON on one line; other text as is; binary as a length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.json, &self.text) {
            (Some(v), _) => write!(f, "{v}"),
            (None, Some(s)) => f.write_str(s),
            (None, None) => write!(f, "({} bytes of binary)", self.bytes),
        }
    }
}

/// Runs the steps and returns the report; `Err` only when the plugin cannot be loaded
/// or the inputs are unusable. Plugin faults and refusals are part of the report.
pub async fn run(input: TestInput<'_>) -> Result<Report, String> {
    let plugin: Arc<Plugin> = Plugin::load(input.plugin, input.limits, crate::plugin::default_cache_dir().as_deref())
        .map_err(|e| e.to_string())?;
    let msg = wit::Message {
        data: input.message,
        attributes: input.attributes,
        message_id: input.message_id.clone(),
        publish_time: None,
        delivery_attempt: Some(1),
    };
    let message_id = input.message_id.clone();
    let finish = |decode, render_failed, steps, conclusion: &str, failed| Report {
        message_id: message_id.clone(),
        decode,
        render_failed,
        steps,
        conclusion: conclusion.to_string(),
        failed,
    };
    let event = match plugin.decode(msg).await {
        Err(fault) => {
            let decode = Decode::Fault { kind: fault.kind(), message: fault.to_string() };
            return Ok(finish(decode, None, Vec::new(), "the message would be stored PARKED", true));
        }
        Ok(Err(e)) => {
            let decode = Decode::Error { reason: e.message };
            return Ok(finish(decode, None, Vec::new(), "the message would be stored PARKED", true));
        }
        Ok(Ok(wit::Decoded::Ignore(reason))) => {
            let decode = Decode::Ignore { reason };
            return Ok(finish(decode, None, Vec::new(), "the message would be stored IGNORED", false));
        }
        Ok(Ok(wit::Decoded::Event(ev))) => ev,
    };
    if let Some(violation) = input.route.and_then(|route| crate::rules::check_event(route, &event).err()) {
        let decode = Decode::Refused { rule: violation.rule, reason: format!("decode output refused: {violation}") };
        return Ok(finish(decode, None, Vec::new(), "the message would be stored PARKED", true));
    }
    let decode = Decode::Event {
        event_type: event.event_type.clone(),
        correlation_key: event.correlation_key.clone(),
        dedup_key: event.dedup_key.clone(),
        schema_version: event.schema_version.clone(),
        body: Body::of(&event.body),
    };

    let mut rendered = event;
    if rendered.dedup_key.as_deref().is_none_or(str::is_empty) {
        rendered.dedup_key = Some(input.message_id.clone());
    }
    let idempotency_key = rendered.dedup_key.clone().unwrap_or_default();
    let mut request = match plugin.render(rendered.clone()).await {
        Err(fault) => {
            let failure = Failure::Fault { kind: fault.kind(), message: fault.to_string() };
            return Ok(finish(decode, Some(failure), Vec::new(), "the attempt would count as failed", true));
        }
        Ok(Err(reason)) => {
            return Ok(finish(decode, Some(Failure::Error { reason }), Vec::new(), "the entry would be PARKED", true));
        }
        Ok(Ok(req)) => req,
    };
    let mut steps = Vec::new();
    let mut exchange = wit::Exchange { step: 1, state: Vec::new() };
    let mut responses = input.responses.into_iter();
    loop {
        if let Some(violation) =
            input.route.and_then(|route| crate::rules::check_request(&route.target, &request).err())
        {
            let failure = Failure::Refused {
                rule: violation.rule,
                reason: format!("request of step {} refused, it would not be sent: {violation}", exchange.step),
            };
            return Ok(finish(decode, Some(failure), steps, "the entry would be PARKED", true));
        }
        let mut step = Step {
            step: exchange.step,
            method: request.method.clone(),
            path: request.path.clone(),
            headers: request.headers.clone(),
            idempotency_key: idempotency_key.clone(),
            body: Body::of(&request.body),
            answer: None,
        };
        let Some(response) = responses.next() else {
            steps.push(step);
            return Ok(finish(decode, None, steps, "classify not run: no --response for this step", false));
        };
        let outcome = response.outcome()?;
        let target = crate::delivery::describe(&outcome);
        let (verdict, conclusion, failed) = match plugin.classify(rendered.clone(), exchange.clone(), outcome).await {
            Err(fault) => (
                Verdict::Fault { kind: fault.kind(), message: fault.to_string() },
                "the attempt would count as failed",
                true,
            ),
            Ok(wit::Disposition::Next(next)) => {
                step.answer = Some(Answer { target, verdict: Verdict::Next { state: Body::of(&next.state) } });
                steps.push(step);
                request = next.request;
                exchange = wit::Exchange { step: exchange.step + 1, state: next.state };
                continue;
            }
            Ok(wit::Disposition::Done) => (Verdict::Done, "the entry would be DONE", false),
            Ok(wit::Disposition::Retry(after_ms)) => (Verdict::Retry { after_ms }, "the entry would be retried", false),
            Ok(wit::Disposition::NotYet(reason)) => {
                (Verdict::NotYet { reason }, "the entry would be tried again until its not-yet deadline", false)
            }
            Ok(wit::Disposition::Park(reason)) => (Verdict::Park { reason }, "the entry would be PARKED", false),
            Ok(wit::Disposition::Ignore(reason)) => (Verdict::Ignore { reason }, "the entry would be IGNORED", false),
        };
        step.answer = Some(Answer { target, verdict });
        steps.push(step);
        return Ok(finish(decode, None, steps, conclusion, failed));
    }
}

impl Report {
    /// The report as a plugin author reads it in a terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = self.write_text(&mut out);
        out
    }

    fn write_text(&self, out: &mut String) -> std::fmt::Result {
        match &self.decode {
            Decode::Fault { kind, message } => {
                return writeln!(out, "decode: plugin fault ({kind}): {message}\n  → {}", self.conclusion);
            }
            Decode::Error { reason } => return writeln!(out, "decode: error: {reason}\n  → {}", self.conclusion),
            Decode::Refused { reason, .. } => return writeln!(out, "decode: {reason}\n  → {}", self.conclusion),
            Decode::Ignore { reason } => return writeln!(out, "decode: ignore: {reason}\n  → {}", self.conclusion),
            Decode::Event { event_type, correlation_key, dedup_key, schema_version, body } => {
                writeln!(out, "decode: event")?;
                writeln!(out, "  event-type:      {event_type}")?;
                writeln!(out, "  correlation-key: {correlation_key}")?;
                match dedup_key.as_deref().filter(|k| !k.is_empty()) {
                    Some(k) => writeln!(out, "  dedup-key:       {k}")?,
                    None => {
                        writeln!(out, "  dedup-key:       (none: the broker message id `{}` is used)", self.message_id)?
                    }
                }
                writeln!(out, "  schema-version:  {}", schema_version.as_deref().unwrap_or("(none)"))?;
                writeln!(out, "  body:            {body}")?;
            }
        }
        for step in &self.steps {
            let label = if step.step == 1 { "render".to_string() } else { format!("next (step {})", step.step) };
            writeln!(out, "{label}: {} {}", step.method, step.path)?;
            for (k, v) in &step.headers {
                writeln!(out, "  {k}: {v}")?;
            }
            writeln!(out, "  idempotency-key: {} (added by the host)", step.idempotency_key)?;
            writeln!(out, "  body: {}", step.body)?;
            let Some(answer) = &step.answer else {
                return writeln!(out, "classify: skipped (no --response given for step {})", step.step);
            };
            let verdict = match &answer.verdict {
                Verdict::Next { state } => format!("next step, state {state}"),
                Verdict::Done => "done".to_string(),
                Verdict::Retry { after_ms: None } => "retry (route backoff)".to_string(),
                Verdict::Retry { after_ms: Some(ms) } => format!("retry after {ms} ms"),
                Verdict::NotYet { reason } => format!("not-yet: {reason}"),
                Verdict::Park { reason } => format!("park: {reason}"),
                Verdict::Ignore { reason } => format!("ignore: {reason}"),
                Verdict::Fault { kind, message } => format!("plugin fault ({kind}): {message}"),
            };
            writeln!(out, "classify ({}): {verdict}", answer.target)?;
        }
        match &self.render_failed {
            Some(Failure::Fault { kind, message }) => {
                writeln!(out, "render: plugin fault ({kind}): {message}\n  → {}", self.conclusion)
            }
            Some(Failure::Error { reason }) => writeln!(out, "render: error: {reason}\n  → {}", self.conclusion),
            Some(Failure::Refused { reason, .. }) => writeln!(out, "render: {reason}\n  → {}", self.conclusion),
            None => Ok(()),
        }
    }
}
