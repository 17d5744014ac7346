//! `inlet pubsub setup` against the real emulator: what it creates is what the
//! routing file asks for, and a subscription changed by hand is reported, field by
//! field, instead of passed over.

use inlet::config::Config;
use inlet::pubsub_client::{Connection, SetupStep, setup};
use inlet_testkit::emulator::PubSubEmulator;

const PROJECT: &str = "setup";

fn routing_file(dir: &std::path::Path, routes: &str) -> Config {
    let path = dir.join("inlet.toml");
    std::fs::write(&path, format!("[store]\nurl = \"sqlite://inbox.db\"\n\n{routes}")).expect("write the routing file");
    std::fs::write(dir.join("plugin.wasm"), b"\0asm").expect("a plugin file");
    Config::load(&path).unwrap_or_else(|e| panic!("routing file: {e}"))
}

fn route(name: &str, subscription: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"plugin.wasm\"\ntarget = {{ kind = \"log\" }}\n\
         source = {{ kind = \"pubsub\", subscription = \"projects/{PROJECT}/subscriptions/{subscription}\", \
         topic = \"projects/{PROJECT}/topics/orders\", dead_letter_topic = \"projects/{PROJECT}/topics/dead\", \
         max_delivery_attempts = 7 }}\n{extra}\n"
    )
}

fn drift_of<'a>(steps: &'a [SetupStep], subscription: &str) -> Option<&'a Vec<String>> {
    steps.iter().find_map(|s| match s {
        SetupStep::Drift { name, differences } if name.ends_with(&format!("/{subscription}")) => Some(differences),
        _ => None,
    })
}

#[tokio::test]
async fn setup_creates_what_the_file_asks_and_reports_a_subscription_changed_by_hand() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    let connection = Connection::emulator(&emulator.host);
    let dir = tempfile::tempdir().expect("a folder");
    // Made by hand before setup ever ran: another topic, no ordering, no dead letters.
    emulator.create_topic("other").await;
    emulator.create_subscription("other", "by-hand", false).await;
    let config =
        routing_file(dir.path(), &format!("{}{}", route("made", "made-by-setup", ""), route("hand", "by-hand", "")));

    let first = setup(&config, &connection).await.expect("setup");
    let shown: Vec<String> = first.iter().map(ToString::to_string).collect();
    assert!(
        shown.contains(&format!("created subscription projects/{PROJECT}/subscriptions/made-by-setup")),
        "{shown:#?}"
    );
    assert!(drift_of(&first, "made-by-setup").is_none(), "what setup made agrees with the file: {shown:#?}");
    let differences = drift_of(&first, "by-hand").unwrap_or_else(|| panic!("no drift reported: {shown:#?}"));
    let all = differences.join("\n");
    assert!(all.contains(&format!("its topic is projects/{PROJECT}/topics/other")), "{all}");
    assert!(all.contains("message ordering is off, the route's ordering is \"per-key\""), "{all}");
    assert!(
        all.contains(&format!(
            "no dead-letter policy, the routing file's source.dead_letter_topic is projects/{PROJECT}/topics/dead"
        )),
        "{all}"
    );
    assert!(all.contains("it has no retry policy (Pub/Sub redelivers a nacked message at once)"), "{all}");
    assert_eq!(differences.len(), 4, "{all}");

    // The one setup made, read back: exactly what the file asks, so a second run only
    // says it exists (and the hand-made one still differs).
    let second = setup(&config, &connection).await.expect("setup again");
    let shown: Vec<String> = second.iter().map(ToString::to_string).collect();
    assert!(
        shown.contains(&format!("subscription projects/{PROJECT}/subscriptions/made-by-setup exists")),
        "{shown:#?}"
    );
    assert!(drift_of(&second, "made-by-setup").is_none(), "no drift on what setup made: {shown:#?}");
    assert!(drift_of(&second, "by-hand").is_some(), "{shown:#?}");

    // A route that does not order: a subscription with ordering is drift too.
    let unordered = routing_file(dir.path(), &route("made", "made-by-setup", "ordering = \"none\""));
    let third = setup(&unordered, &connection).await.expect("setup, unordered");
    let differences = drift_of(&third, "made-by-setup").expect("ordering drift");
    assert_eq!(differences, &vec!["message ordering is on, the route's ordering is \"none\"".to_string()]);
}

/// Every subscription setting a route can ask for, created as asked and read back from
/// the emulator; then changed by hand and reported, one difference per setting. (The
/// emulator keeps a filter but does not apply it, and refuses to change one; Google's
/// service cannot change a filter either.)
#[tokio::test]
async fn setup_gives_a_subscription_every_setting_of_its_route_and_reports_each_changed_by_hand() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    let connection = Connection::emulator(&emulator.host);
    let dir = tempfile::tempdir().expect("a folder");
    emulator.create_topic("orders").await;
    emulator.create_subscription("orders", "by-hand", true).await;
    let settings = r#"filter = 'attributes.type = "order"'
exactly_once = true
redelivery_backoff = ["10s", "600s"]
retain_acked = "1h"
"#;
    let full = route("full", "full", "").replace(
        "max_delivery_attempts = 7 }",
        &format!("max_delivery_attempts = 20, {} }}", settings.trim().replace('\n', ", ")),
    );
    assert!(full.contains("exactly_once = true"), "{full}");
    let config = routing_file(
        dir.path(),
        &format!(
            "{full}{}",
            route("hand", "by-hand", "").replace(
                "max_delivery_attempts = 7 }",
                "max_delivery_attempts = 7, filter = 'attributes.type = \"order\"' }"
            )
        ),
    );

    let steps = setup(&config, &connection).await.expect("setup");
    let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
    assert!(
        shown.contains(&format!(
            "created subscription projects/{PROJECT}/subscriptions/full, keeping acked messages for 1h"
        )),
        "{shown:#?}"
    );
    let made = emulator.subscription("full").await;
    assert_eq!(made["topic"], format!("projects/{PROJECT}/topics/orders"), "{made}");
    assert_eq!(made["enableMessageOrdering"], true, "{made}");
    assert_eq!(made["filter"], "attributes.type = \"order\"", "{made}");
    assert_eq!(made["enableExactlyOnceDelivery"], true, "{made}");
    assert_eq!(made["retryPolicy"]["minimumBackoff"], "10s", "{made}");
    assert_eq!(made["retryPolicy"]["maximumBackoff"], "600s", "{made}");
    assert_eq!(made["deadLetterPolicy"]["deadLetterTopic"], format!("projects/{PROJECT}/topics/dead"), "{made}");
    assert_eq!(made["deadLetterPolicy"]["maxDeliveryAttempts"], 20, "{made}");
    assert_eq!(made["retainAckedMessages"], true, "{made}");
    assert_eq!(made["messageRetentionDuration"], "3600s", "{made}");
    assert!(drift_of(&steps, "full").is_none(), "what setup made agrees with the file: {shown:#?}");
    // 20 attempts 10s, 20s, … up to 600s apart ride out more than an hour of outage;
    // the hand-made route's 7 attempts 1s to 32s apart do not.
    let warnings: Vec<&String> = shown.iter().filter(|s| s.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 1, "{shown:#?}");
    assert!(
        warnings[0].contains("subscriptions/by-hand dead-letters a message after 7 delivery attempts"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("is about 63s of nacks"), "{warnings:?}");
    let hand = drift_of(&steps, "by-hand").expect("the hand-made subscription differs").join("\n");
    assert!(
        hand.contains("it has no filter, the routing file's source.filter is attributes.type = \"order\""),
        "{hand}"
    );

    // Changed by hand: exactly-once off, another backoff.
    emulator
        .update_subscription(
            "full",
            serde_json::json!({
                "enableExactlyOnceDelivery": false,
                "retryPolicy": { "minimumBackoff": "1s", "maximumBackoff": "5s" },
            }),
            "enableExactlyOnceDelivery,retryPolicy",
        )
        .await;
    let steps = setup(&config, &connection).await.expect("setup again");
    let differences = drift_of(&steps, "full").expect("the changes by hand are reported");
    assert_eq!(
        differences,
        &vec![
            "exactly-once delivery is off, the routing file's source.exactly_once is true".to_string(),
            "its redelivery backoff is 1s to 5s, the routing file's source.redelivery_backoff is 10s to 10m"
                .to_string(),
        ]
    );
    let kept = emulator.subscription("full").await;
    assert_ne!(kept["enableExactlyOnceDelivery"], true, "left as it is: {kept}");
}

/// A push route that names its subscription: setup creates it pushing to the route's
/// endpoint, with the OIDC token the route's auth checks and, for an unwrapped route,
/// no wrapper with metadata headers; read back from the emulator. A push subscription
/// made by hand is reported for its endpoint, token and format, and a pull route on a
/// push subscription for pushing.
#[tokio::test]
async fn setup_creates_a_push_subscription_as_its_route_takes_pushes_and_reports_one_made_otherwise() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    let connection = Connection::emulator(&emulator.host);
    let dir = tempfile::tempdir().expect("a folder");
    emulator.create_topic("orders").await;
    let topic = format!("projects/{PROJECT}/topics/orders");
    emulator
        .put_subscription(
            "pushed-by-hand",
            &serde_json::json!({
                "topic": topic,
                "pushConfig": { "pushEndpoint": "http://127.0.0.1:9/somewhere-else" },
                "retryPolicy": { "minimumBackoff": "1s", "maximumBackoff": "60s" },
            }),
        )
        .await;
    let push = |name: &str, subscription: &str| {
        format!(
            "[[route]]\nname = \"{name}\"\nplugin = \"plugin.wasm\"\ntarget = {{ kind = \"log\" }}\nordering = \"none\"\n\
             source = {{ kind = \"push\", wrapper = false, subscription = \"projects/{PROJECT}/subscriptions/{subscription}\", \
             topic = \"{topic}\", endpoint = \"http://127.0.0.1:9/push/{name}\", \
             auth = {{ audience = \"https://inlet.example/push\", service_account = \"pusher@{PROJECT}.iam.gserviceaccount.com\" }} }}\n"
        )
    };
    let pulled = format!(
        "[[route]]\nname = \"pulled\"\nplugin = \"plugin.wasm\"\ntarget = {{ kind = \"log\" }}\nordering = \"none\"\n\
         source = {{ kind = \"pubsub\", subscription = \"projects/{PROJECT}/subscriptions/pushed-by-hand\" }}\n"
    );
    let config =
        routing_file(dir.path(), &format!("{}\n{}\n", push("pushed", "push-made"), push("by-hand", "pushed-by-hand")));

    let steps = setup(&config, &connection).await.expect("setup");
    let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
    assert!(shown.contains(&format!("created subscription projects/{PROJECT}/subscriptions/push-made")), "{shown:#?}");
    let made = emulator.subscription("push-made").await;
    let config_made = &made["pushConfig"];
    assert_eq!(config_made["pushEndpoint"], "http://127.0.0.1:9/push/pushed", "{made}");
    assert_eq!(
        config_made["oidcToken"]["serviceAccountEmail"],
        format!("pusher@{PROJECT}.iam.gserviceaccount.com"),
        "{made}"
    );
    assert_eq!(config_made["oidcToken"]["audience"], "https://inlet.example/push", "{made}");
    assert_eq!(config_made["noWrapper"]["writeMetadata"], true, "{made}");
    assert_eq!(made["ackDeadlineSeconds"], 60, "{made}");
    assert!(drift_of(&steps, "push-made").is_none(), "what setup made agrees with the file: {shown:#?}");

    // The hand-made push subscription, seen by the push route and by a pull route (in
    // a file of its own: one file may not both push and pull a subscription).
    let pull_dir = tempfile::tempdir().expect("a folder");
    let pull_config = routing_file(pull_dir.path(), &pulled);
    let pull_steps = setup(&pull_config, &connection).await.expect("setup of the pull route");
    let differences: Vec<&String> = steps
        .iter()
        .chain(&pull_steps)
        .filter_map(|s| match s {
            SetupStep::Drift { name, differences } if name.ends_with("/pushed-by-hand") => Some(differences),
            _ => None,
        })
        .flatten()
        .collect();
    let all = differences.iter().map(|d| d.as_str()).collect::<Vec<_>>().join("\n");
    assert!(
        all.contains("it pushes to http://127.0.0.1:9/somewhere-else, the routing file's source.endpoint is http://127.0.0.1:9/push/by-hand"),
        "{all}"
    );
    assert!(
        all.contains(&format!(
            "it sends no token, the route's auth expects an OIDC token of pusher@{PROJECT}.iam.gserviceaccount.com for audience https://inlet.example/push"
        )),
        "{all}"
    );
    assert!(
        all.contains("it sends the JSON envelope (wrapped), the route takes the data unwrapped, with metadata headers"),
        "{all}"
    );
    assert!(all.contains("it pushes to http://127.0.0.1:9/somewhere-else, the route pulls (a pull source)"), "{all}");
    assert_eq!(differences.len(), 4, "{all}");

    // A second run finds what it made as it made it.
    let again = setup(&config, &connection).await.expect("setup again");
    assert!(drift_of(&again, "push-made").is_none(), "{again:#?}");
}
