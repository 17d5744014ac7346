//! Verified push: a push route that requires Pub/Sub's OIDC token accepts a token
//! signed by a key of its JWKS and refuses every other one with the right status,
//! no row and a metric by reason; a key rotation is picked up. The test makes its own
//! RSA keys and serves their JWKS from a real local HTTP server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use inlet_testkit::in_process::{Instance, start_on_sqlite};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::{wait_for, wait_until};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsa::pkcs1::EncodeRsaPrivateKey;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const AUDIENCE: &str = "https://inlet.test/push/orders";
const ACCOUNT: &str = "push-orders@acme.iam.gserviceaccount.com";

/// An RSA signing key with its `kid`.
struct Key {
    kid: String,
    encoding: EncodingKey,
}

impl Key {
    fn generate(kid: &str) -> Key {
        let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).expect("generate an RSA key");
        let der = private.to_pkcs1_der().expect("PKCS#1 DER");
        Key { kid: kid.into(), encoding: EncodingKey::from_rsa_der(der.as_bytes()) }
    }

    /// The public half as a JWK, the way Google publishes it.
    fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.encoding, Algorithm::RS256).expect("a JWK of the key");
        jwk.common.key_id = Some(self.kid.clone());
        jwk
    }

    /// A token signed by this key, announcing `kid`.
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign a token")
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }
}

/// A JWKS endpoint whose keys the test changes, counting fetches.
#[derive(Clone, Default)]
struct Jwks {
    keys: Arc<Mutex<Vec<Jwk>>>,
    fetches: Arc<AtomicUsize>,
}

impl Jwks {
    async fn serve(&self) -> String {
        async fn certs(State(j): State<Jwks>) -> Json<JwkSet> {
            j.fetches.fetch_add(1, Ordering::SeqCst);
            Json(JwkSet { keys: j.keys.lock().unwrap().clone() })
        }
        let app = axum::Router::new().route("/certs", axum::routing::get(certs)).with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/certs", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    fn publish(&self, keys: &[&Key]) {
        *self.keys.lock().unwrap() = keys.iter().map(|k| k.jwk()).collect();
    }
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// The claims Pub/Sub puts in a push token, valid for an hour.
fn good_claims() -> Value {
    json!({
        "iss": "https://accounts.google.com",
        "aud": AUDIENCE,
        "email": ACCOUNT,
        "email_verified": true,
        "sub": "1234567890",
        "iat": now() - 5,
        "exp": now() + 3600,
    })
}

fn with(mut claims: Value, field: &str, value: Value) -> Value {
    claims[field] = value;
    claims
}

struct Setup {
    instance: Instance,
    http: reqwest::Client,
    sent: AtomicUsize,
}

impl Setup {
    async fn start(jwks_url: &str) -> Setup {
        let routes = format!(
            "[[route]]\nname = \"orders\"\nplugin = \"{}\"\ntarget = {{ kind = \"log\" }}\n\
             source = {{ kind = \"push\", auth = {{ audience = \"{AUDIENCE}\", service_account = \"{ACCOUNT}\", jwks_url = \"{jwks_url}\" }} }}\n",
            plugin_path("work_order").display()
        );
        let instance = start_on_sqlite(&routes, |_| {}).await;
        Setup { instance, http: reqwest::Client::new(), sent: AtomicUsize::new(0) }
    }

    /// Pushes a fresh message with `token` (if any); the status and the message id.
    async fn push(&self, token: Option<&str>) -> (u16, String) {
        let id = format!("m-{}", self.sent.fetch_add(1, Ordering::SeqCst));
        let data = br#"{"workOrderId":"k","completedItems":1,"completionTimestamp":"t"}"#;
        let mut req = self
            .http
            .post(format!("{}/push/orders", self.instance.base()))
            .header("content-type", "application/json")
            .body(push_envelope(data, &[], &id).to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        (req.send().await.unwrap().status().as_u16(), id)
    }

    async fn stored_message_ids(&self) -> Vec<String> {
        let filter = inlet::inbox::ListFilter { route: Some("orders".into()), limit: 1000, ..Default::default() };
        self.instance.running.shared.store.list(&filter).await.unwrap().into_iter().map(|e| e.message_id).collect()
    }

    fn refused(&self, reason: &str) -> u64 {
        let text = self.instance.running.shared.metrics.render();
        let prefix = format!("inlet_push_auth_refused_total{{route=\"orders\",reason=\"{reason}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.trim().parse().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_valid_token_from_the_subscription_stores_a_row() {
    let (k1, stranger) = (Key::generate("k1"), Key::generate("k1-forged"));
    let jwks = Jwks::default();
    jwks.publish(&[&k1]);
    let setup = Setup::start(&jwks.serve().await).await;

    let (status, accepted) = setup.push(Some(&k1.sign(&good_claims()))).await;
    assert_eq!(status, 200, "a valid token is accepted");
    // Within the skew, a sender's clock slightly ahead is tolerated.
    let (status, ahead) = setup.push(Some(&k1.sign(&with(good_claims(), "iat", json!(now() + 5))))).await;
    assert_eq!(status, 200, "a token issued 5 s ahead is accepted");

    let cases: Vec<(&str, Option<String>, u16, &str)> = vec![
        ("no token", None, 401, "missing"),
        ("not a JWT", Some("abc.def".into()), 401, "malformed"),
        ("expired", Some(k1.sign(&with(good_claims(), "exp", json!(now() - 600)))), 401, "expired"),
        ("issued a day ahead", Some(k1.sign(&with(good_claims(), "iat", json!(now() + 86_400)))), 401, "not_yet_valid"),
        ("issued a minute ahead", Some(k1.sign(&with(good_claims(), "iat", json!(now() + 60)))), 401, "not_yet_valid"),
        ("issued at no time", Some(k1.sign(&with(good_claims(), "iat", json!("yesterday")))), 401, "malformed"),
        ("wrong audience", Some(k1.sign(&with(good_claims(), "aud", json!("https://other.test")))), 401, "audience"),
        ("wrong issuer", Some(k1.sign(&with(good_claims(), "iss", json!("https://evil.example")))), 401, "issuer"),
        ("wrong signature", Some(stranger.sign_as("k1", &good_claims())), 401, "signature"),
        ("wrong email", Some(k1.sign(&with(good_claims(), "email", json!("someone@else.test")))), 403, "email"),
        (
            "email not verified",
            Some(k1.sign(&with(good_claims(), "email_verified", json!(false)))),
            403,
            "email_unverified",
        ),
    ];
    for (what, token, expected, reason) in cases {
        let before = setup.refused(reason);
        let (status, _) = setup.push(token.as_deref()).await;
        assert_eq!(status, expected, "{what}");
        assert_eq!(setup.refused(reason), before + 1, "{what}: inlet_push_auth_refused_total{{reason=\"{reason}\"}}");
    }
    assert_eq!(setup.stored_message_ids().await, vec![accepted, ahead], "only the accepted pushes left a row");
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 1, "the keys were fetched once and cached");
    setup.instance.running.stop().await;
}

/// On a verified route the token binds the request to its
/// audience, so the `Host` rule does not apply (a load balancer's name need not be in
/// `public_hosts`); `Origin` is refused on every push all the same (a browser page never
/// holds Pub/Sub's token), before the token is looked at, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_push_needs_no_own_host_but_no_push_takes_an_origin() {
    let k1 = Key::generate("k1");
    let jwks = Jwks::default();
    jwks.publish(&[&k1]);
    let setup = Setup::start(&jwks.serve().await).await;
    let push = |host: Option<&str>, origin: Option<&str>, token: Option<String>, id: &str| {
        let data = format!(r#"{{"workOrderId":"{id}","completedItems":1,"completionTimestamp":"t"}}"#);
        let mut req = setup
            .http
            .post(format!("{}/push/orders", setup.instance.base()))
            .header("content-type", "application/json")
            .body(push_envelope(data.as_bytes(), &[], id).to_string());
        if let Some(h) = host {
            req = req.header("host", h);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let token = || Some(k1.sign(&good_claims()));
    assert_eq!(push(Some("push.example.net"), None, token(), "lb").await, 200, "any Host with a valid token");
    assert_eq!(push(Some("push.example.net"), None, None, "no-token").await, 401, "push auth answers, not the gate");
    assert_eq!(push(None, Some("https://evil.example"), token(), "origin").await, 403, "Origin on a verified push");
    assert_eq!(setup.stored_message_ids().await, ["lb"]);
    setup.instance.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_picked_up_and_unknown_keys_do_not_hammer_the_jwks() {
    let (k1, k2) = (Key::generate("k1"), Key::generate("k2"));
    let jwks = Jwks::default();
    jwks.publish(&[&k1]);
    let setup = Setup::start(&jwks.serve().await).await;
    assert_eq!(setup.push(Some(&k1.sign(&good_claims()))).await.0, 200);

    // Tokens naming a key nobody published: refused, and at most one refetch per
    // interval, however many arrive.
    let fetches = jwks.fetches.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(setup.push(Some(&k2.sign_as("k-unknown", &good_claims()))).await.0, 401);
    }
    assert!(setup.refused("unknown_key") >= 20);
    let refetches = jwks.fetches.load(Ordering::SeqCst) - fetches;
    assert!(refetches <= 2, "{refetches} refetches for 20 unknown-key tokens");

    // Google rotates: k2 is published beside k1. Pub/Sub retries a refused push, so
    // the new key is picked up within the refetch interval.
    jwks.publish(&[&k1, &k2]);
    let token = k2.sign(&good_claims());
    let id = wait_for("a k2 token to be accepted", WAIT, || {
        let token = token.clone();
        let setup = &setup;
        async move {
            let (status, id) = setup.push(Some(&token)).await;
            (status == 200).then_some(id)
        }
    })
    .await;
    assert!(setup.stored_message_ids().await.contains(&id));
    assert_eq!(setup.push(Some(&k1.sign(&good_claims()))).await.0, 200, "k1 still works");

    // k1 is withdrawn: once the keys are fetched again, its tokens are refused.
    jwks.publish(&[&k2]);
    let (k3, fetches) = (Key::generate("k3"), jwks.fetches.load(Ordering::SeqCst));
    wait_until("a refetch after the refetch interval", WAIT, || async {
        setup.push(Some(&k3.sign(&good_claims()))).await;
        jwks.fetches.load(Ordering::SeqCst) > fetches
    })
    .await;
    assert_eq!(setup.push(Some(&k1.sign(&good_claims()))).await.0, 401, "a withdrawn key no longer verifies");
    setup.instance.running.stop().await;
}

/// The JWKS fetch follows no redirect: a JWKS URL answering 3xx (whatever it points
/// to, here the real keys) is a failed fetch, and the token waits for a fetch that
/// works (503, Pub/Sub retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_answering_a_redirect_gives_no_keys() {
    let k1 = Key::generate("k1");
    let jwks = Jwks::default();
    jwks.publish(&[&k1]);
    let keys_url = jwks.serve().await;
    let moved = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&moved);
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::SeqCst);
        let location = keys_url.clone();
        async move { (axum::http::StatusCode::FOUND, [(axum::http::header::LOCATION, location)]) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/certs", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let setup = Setup::start(&url).await;
    let (status, _) = setup.push(Some(&k1.sign(&good_claims()))).await;
    assert_eq!(status, 503, "no keys: the redirect was not followed");
    assert_eq!(setup.refused("keys_unavailable"), 1);
    assert_eq!(moved.load(Ordering::SeqCst), 1, "the JWKS URL was asked once");
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 0, "the redirect's target was never asked");
    assert!(setup.stored_message_ids().await.is_empty());
    setup.instance.running.stop().await;
}

/// A JWKS URL answering more than 1 MiB, or something that is no JWKS, gives no keys
/// (503, Pub/Sub retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_answering_too_much_or_no_jwks_gives_no_keys() {
    let k1 = Key::generate("k1");
    let app = axum::Router::new()
        .route("/huge", axum::routing::get(|| async { format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(2 << 20)) }))
        .route("/other", axum::routing::get(|| async { "{\"keys\": \"not a list\"}" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for path in ["huge", "other"] {
        let setup = Setup::start(&format!("{base}/{path}")).await;
        let (status, _) = setup.push(Some(&k1.sign(&good_claims()))).await;
        assert_eq!(status, 503, "{path}: no keys");
        assert_eq!(setup.refused("keys_unavailable"), 1, "{path}");
        assert!(setup.stored_message_ids().await.is_empty(), "{path}");
        setup.instance.running.stop().await;
    }
}

/// A refused route is answered only once a request passes its push auth (its own
/// `source.auth`, else `[push] auth`), and then with a bare 503: the reason quotes the
/// routing file, and is for the admin API only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_route_answers_only_after_its_push_auth_and_without_the_reason() {
    let k1 = Key::generate("k1");
    let jwks = Jwks::default();
    jwks.publish(&[&k1]);
    let jwks_url = jwks.serve().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin_path("future_contract"), dir.path().join("future.wasm")).unwrap();
    let file = dir.path().join("inlet.toml");
    // `orders` names a plugin that is not there (refused by the configuration), with its
    // own push auth; `billing` one built for another contract (refused when loaded),
    // under `[push] auth`, whose audience names each route.
    let auth = |audience: &str| {
        format!("{{ audience = \"{audience}\", service_account = \"{ACCOUNT}\", jwks_url = \"{jwks_url}\" }}")
    };
    std::fs::write(
        &file,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[push]\nauth = {}\n\n\
             [[route]]\nname = \"orders\"\nplugin = \"plugins/${{PLUGIN_NAME}}.wasm\"\ntarget = {{ kind = \"log\" }}\n\
             source = {{ kind = \"push\", auth = {} }}\n\n\
             [[route]]\nname = \"billing\"\nplugin = \"future.wasm\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            auth("https://inlet.test/push/{route}"),
            auth(AUDIENCE),
        ),
    )
    .unwrap();
    const MARKER: &str = "MARKER-expanded-into-a-path";
    let env = |name: &str| (name == "PLUGIN_NAME").then(|| MARKER.to_string());
    let config = inlet::config::Config::load_partial_with(&file, &env).unwrap();
    assert_eq!(config.refused.len(), 1, "orders is refused by its configuration: {:?}", config.refused);
    let options = inlet::app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        ..inlet::app::Options::default()
    };
    let running = inlet::app::start(&config, options).await.unwrap();
    let http = reqwest::Client::new();
    let push = |route: &str, token: Option<String>| {
        let mut req = http
            .post(format!("http://{}/push/{route}", running.addr))
            .header("content-type", "application/json")
            .body(push_envelope(b"{}", &[], "m-1").to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap())
        }
    };
    for (route, audience) in [("orders", AUDIENCE), ("billing", "https://inlet.test/push/billing")] {
        let (status, body) = push(route, None).await;
        assert_eq!((status, body["reason"].as_str()), (401, Some("missing")), "{route}: {body}");
        let other = k1.sign(&with(good_claims(), "aud", json!("https://inlet.test/push/another")));
        let (status, body) = push(route, Some(other)).await;
        assert_eq!((status, body["reason"].as_str()), (401, Some("audience")), "{route}: {body}");
        let (status, body) = push(route, Some(k1.sign(&with(good_claims(), "aud", json!(audience))))).await;
        assert_eq!((status, body["reason"].as_str()), (503, Some("route_refused")), "{route}: {body}");
        let text = body.to_string();
        for detail in [MARKER, "PLUGIN_NAME", "plugin", "contract", "future.wasm"] {
            assert!(!text.contains(detail), "{route}: the answer gives the reason away ({detail}): {text}");
        }
    }
    let filter = inlet::inbox::ListFilter { limit: 10, ..Default::default() };
    assert!(running.shared.store.list(&filter).await.unwrap().is_empty(), "nothing stored");
    running.stop().await;
}
