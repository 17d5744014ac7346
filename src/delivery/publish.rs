//! The Pub/Sub target: publish the rendered request's body to a topic, with its
//! headers and the configured attributes as message attributes, and — when the
//! route asks — the entry's correlation key as ordering key.
//!
//! The answer is shaped like an HTTP response so the plugins' `classify` reads it
//! the way it reads any target: a publish that got a message id is `200` with
//! `{"messageId": "…"}`; a refusal by the service carries the HTTP status of its
//! gRPC code (404 topic not found, 403 permission denied, 400 invalid argument,
//! 503 unavailable …); no answer in time is a transport timeout.

use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::model::Message;
use tokio::sync::OnceCell;

use super::{Delivery, transport};
use crate::config::PubsubTarget as Config;
use crate::plugin::wit;
use crate::pubsub_client::Connection;

pub struct PubsubTarget {
    config: Config,
    connection: Connection,
    /// Built on first use: building is async, a route is built synchronously.
    publisher: OnceCell<Publisher>,
}

impl PubsubTarget {
    pub fn new(config: Config, connection: Connection) -> PubsubTarget {
        PubsubTarget { config, connection, publisher: OnceCell::new() }
    }

    pub async fn deliver(&self, req: &wit::Request, delivery: &Delivery<'_>) -> wit::Outcome {
        let publisher = match self
            .publisher
            .get_or_try_init(|| self.connection.publisher(&self.config.topic, self.config.timeout))
            .await
        {
            Ok(p) => p,
            Err(e) => return transport(wit::TransportErrorKind::Connect, e),
        };
        let mut attributes: Vec<(String, String)> =
            self.config.attributes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        attributes.extend(req.headers.iter().cloned());
        attributes.push(("idempotency_key".to_string(), delivery.idempotency_key.to_string()));
        if let Some(name) = &self.config.id_attribute {
            attributes.push((name.clone(), delivery.idempotency_key.to_string()));
        }
        let mut message = Message::new().set_data(req.body.clone()).set_attributes(attributes);
        let ordering_key = self.config.ordering_key.then_some(delivery.correlation_key).filter(|k| !k.is_empty());
        if let Some(key) = ordering_key {
            message = message.set_ordering_key(key);
        }
        // The client retries for up to ten minutes and has no per-attempt timeout:
        // the route's timeout bounds the whole publish.
        let result = tokio::time::timeout(self.config.timeout, publisher.publish(message)).await;
        if result.as_ref().map_or(true, |r| r.is_err())
            && let Some(key) = ordering_key
        {
            // A failed publish pauses its ordering key in the client; the relay
            // retries the entry, so let the key go again.
            publisher.resume_publish(key);
        }
        match result {
            Ok(Ok(id)) => wit::Outcome::Response(wit::Response {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: serde_json::json!({ "messageId": id }).to_string().into_bytes(),
            }),
            Ok(Err(e)) => publish_error(e),
            Err(_) => transport(
                wit::TransportErrorKind::Timeout,
                format!("publish to {} did not complete within {:?}", self.config.topic, self.config.timeout),
            ),
        }
    }
}

fn publish_error(e: PublishError) -> wit::Outcome {
    let rpc = match &e {
        PublishError::Rpc(rpc) => rpc,
        // Paused or shut down: nothing reached the service, try again.
        _ => return transport(wit::TransportErrorKind::Other, e.to_string()),
    };
    let Some(status) = rpc.status() else {
        let kind = if rpc.is_timeout() { wit::TransportErrorKind::Timeout } else { wit::TransportErrorKind::Connect };
        return transport(kind, rpc.to_string());
    };
    wit::Outcome::Response(wit::Response {
        status: http_status(status.code),
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::json!({ "code": format!("{:?}", status.code), "message": status.message })
            .to_string()
            .into_bytes(),
    })
}

/// The HTTP status Google's own HTTP mapping gives each gRPC code.
fn http_status(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::ResourceExhausted => 429,
        Code::Cancelled => 499,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::DeadlineExceeded => 504,
        _ => 500,
    }
}
