//! The audit log: every operator action, from the API, the console or the CLI, is
//! written to the inbox's `inbox_audit` table and to the logs. Refused attempts are
//! only logged (by `admin::access`): storing them would let anyone fill the table.

use crate::clock::Millis;
use crate::inbox::{NewAudit, Store};

/// Records `audit` in the store and the log. A failed write is logged, not
/// returned: the action already happened, and the log line still says so.
pub async fn record(store: &dyn Store, audit: NewAudit, now: Millis) {
    tracing::info!(
        actor = %audit.actor,
        action = audit.action.as_str(),
        route = audit.route.as_deref().unwrap_or("-"),
        subject = %audit.subject,
        outcome = audit.outcome.as_str(),
        detail = audit.detail.as_deref().unwrap_or(""),
        "audit: repair action"
    );
    if let Err(error) = store.record_audit(&audit, now).await {
        tracing::error!(%error, actor = %audit.actor, action = audit.action.as_str(), "could not write the audit log");
    }
}

/// The actor name of the command line acting on the store: `cli:<user>`.
pub fn cli_actor() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}")
}
