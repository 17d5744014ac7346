//! The `work-order-completed` event as the maintenance system publishes it, shared by
//! the plugins that deliver it to different engines (Camunda 7, Flowable).
//!
//! Payload: `{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}`,
//! optionally with `"eventId"` (or an `eventId` attribute) as the business dedup key.

use serde::{Deserialize, Serialize};

pub const EVENT_TYPE: &str = "work-order-completed";

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrderCompleted {
    pub work_order_id: String,
    pub completed_items: u32,
    pub completion_timestamp: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

/// What `decode` needs: the correlation key, the dedup key and the body to store.
pub struct Parsed {
    pub correlation_key: String,
    pub dedup_key: Option<String>,
    pub body: Vec<u8>,
}

/// Reads a broker message; the error is the decode-error text.
pub fn parse(data: &[u8], attributes: &[(String, String)]) -> Result<Parsed, String> {
    let order: WorkOrderCompleted =
        serde_json::from_slice(data).map_err(|e| format!("payload is not a work-order-completed event: {e}"))?;
    if order.work_order_id.trim().is_empty() {
        return Err("workOrderId is empty".into());
    }
    let dedup_key = attributes.iter().find(|(k, _)| k == "eventId").map(|(_, v)| v.clone()).or_else(|| order.event_id.clone());
    Ok(Parsed {
        correlation_key: order.work_order_id.clone(),
        dedup_key,
        body: serde_json::to_vec(&order).expect("a decoded event serializes"),
    })
}

/// Reads the body `parse` stored.
pub fn from_body(body: &[u8]) -> Result<WorkOrderCompleted, String> {
    serde_json::from_slice(body).map_err(|e| format!("stored body is not a work order: {e}"))
}

/// The body of `decode` for every plugin that takes this event: expands inside the
/// plugin, where its generated `Event`, `Decoded` and `DecodeError` types live.
#[macro_export]
macro_rules! decode {
    ($msg:expr) => {{
        let msg = $msg;
        let parsed = $crate::parse(&msg.data, &msg.attributes).map_err(|message| DecodeError { message })?;
        Ok(Decoded::Event(Event {
            event_type: $crate::EVENT_TYPE.into(),
            correlation_key: parsed.correlation_key,
            dedup_key: parsed.dedup_key,
            body: parsed.body,
            schema_version: Some("1".into()),
        }))
    }};
}
