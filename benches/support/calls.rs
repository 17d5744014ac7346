//! The work-order plugin's cycle (decode → render → classify) and the same logic in
//! native Rust, for the benchmarks that put a plugin call beside native code.

use std::hint::black_box;
use std::time::{Duration, Instant};

use inlet::plugin::{Plugin, wit};
use serde_json::json;

pub const PAYLOAD: &[u8] = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;

fn message() -> wit::Message {
    wit::Message {
        data: PAYLOAD.to_vec(),
        attributes: vec![("eventId".into(), "evt-1".into())],
        message_id: "m-1".into(),
        publish_time: None,
        delivery_attempt: Some(1),
    }
}

fn answer() -> wit::Outcome {
    wit::Outcome::Response(wit::Response { status: 204, headers: vec![], body: vec![] })
}

/// The plugin's logic, natively: the shared event crate plus the same rendering.
pub fn native_cycle() -> usize {
    let attrs = vec![("eventId".to_string(), "evt-1".to_string())];
    let parsed = work_order_event::parse(PAYLOAD, &attrs).unwrap();
    let order = work_order_event::from_body(&parsed.body).unwrap();
    let body = json!({
        "messageName": "WorkOrderCompleted",
        "correlationKeys": { "workOrderId": { "value": order.work_order_id, "type": "String" } },
        "processVariables": {
            "completedItems": { "value": order.completed_items, "type": "Integer" },
            "completionTimestamp": { "value": order.completion_timestamp, "type": "String" }
        },
        "resultEnabled": false
    });
    let request = serde_json::to_vec(&body).unwrap();
    let done = matches!(black_box(204u16), 200..=299);
    request.len() + usize::from(done) + parsed.correlation_key.len()
}

/// One decode, render and classify through the plugin, as the host makes them.
pub async fn plugin_cycle(p: &Plugin) -> usize {
    let Ok(Ok(wit::Decoded::Event(ev))) = p.decode(message()).await else { panic!("decode") };
    let Ok(Ok(req)) = p.render(ev.clone()).await else { panic!("render") };
    let d = p.classify(ev, wit::Exchange { step: 1, state: vec![] }, answer()).await.unwrap();
    req.body.len() + usize::from(matches!(d, wit::Disposition::Done))
}

/// The mean time of one `f()` over `n` calls, after `n / 10` calls of warm-up.
pub fn per_call(n: usize, mut f: impl FnMut() -> usize) -> Duration {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    start.elapsed() / n as u32
}
