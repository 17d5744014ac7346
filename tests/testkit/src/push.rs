//! Pushes as a Pub/Sub push subscription sends them: the envelope, and posting it to a
//! route's push endpoint.

use base64::Engine as _;

use crate::utc::rfc3339_now;

/// A Google Pub/Sub push envelope, as POSTed by a push subscription. Both the camelCase
/// and the snake_case spellings of the message fields are present, as Google sends them.
pub fn push_envelope(data: &[u8], attributes: &[(&str, &str)], message_id: &str) -> serde_json::Value {
    let attributes: serde_json::Map<String, serde_json::Value> =
        attributes.iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned()))).collect();
    let publish_time = rfc3339_now();
    serde_json::json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "attributes": attributes,
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": publish_time,
            "publish_time": publish_time,
        },
        "subscription": "projects/test/subscriptions/test",
    })
}

/// POSTs a push envelope to `BASE/push/ROUTE`, as a push subscription does; the answer.
pub async fn send_push(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    envelope: &serde_json::Value,
) -> reqwest::Response {
    http.post(format!("{base}/push/{route}"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("push to route {route}: {e}"))
}

/// [`send_push`], for its status alone.
pub async fn post_push(http: &reqwest::Client, base: &str, route: &str, envelope: &serde_json::Value) -> u16 {
    send_push(http, base, route, envelope).await.status().as_u16()
}

/// Pushes work order `key`'s event number `seq` (the work-order plugin's event, message
/// id `ROUTE-KEY-SEQ`) to `BASE/push/ROUTE`; the status and the answer's text.
pub async fn push_work_order(http: &reqwest::Client, base: &str, route: &str, key: &str, seq: u32) -> (u16, String) {
    let data = format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#);
    let envelope = push_envelope(data.as_bytes(), &[], &format!("{route}-{key}-{seq}"));
    let response = send_push(http, base, route, &envelope).await;
    (response.status().as_u16(), response.text().await.unwrap())
}
