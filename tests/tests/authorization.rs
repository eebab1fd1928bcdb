//! The connector's own authentication and authorization on every backend, the real KubeMQ
//! included: KubeMQ community v2.4.0 enforces neither, so what a client may do must never rest
//! on the broker (python-qpid-proton, tests/python/auth.py).

use connector::auth::jwt::SignatureType;
use connector::config::Settings;
use interop_tests::{run_client_script, TestConnector};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
/// The HMAC secret the connector checks tokens with.
const SECRET: &str = "authorization-on-every-backend-secret";

/// alice may use queue `a` and read events on `sub.` and one more token; bob may use queue `b`;
/// app may write events on `sub.` anything.
const ACL: &str = r#"[
  {"Queues": true, "ClientID": "^alice$", "Channel": "^a$", "Read": true, "Write": true},
  {"Queues": true, "ClientID": "^bob$", "Channel": "^b$", "Read": true, "Write": true},
  {"Events": true, "ClientID": "^app$", "Channel": "^sub\\..+$", "Read": false, "Write": true},
  {"Events": true, "ClientID": "^alice$", "Channel": "^sub\\.[^.]+$", "Read": true, "Write": false}
]"#;

/// A token for `client_id`, valid for ten minutes, recorded as a secret no log may hold.
fn token(client_id: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        + 600;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &serde_json::json!({"ClientID": client_id, "exp": exp}),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("a token");
    testkit::logs::used_secret(&token);
    token
}

/// Settings with authentication and [`ACL`], their files in `dir`.
fn secured(dir: &std::path::Path) -> Settings {
    testkit::logs::used_secret(SECRET);
    let key = dir.join("jwt.key");
    std::fs::write(&key, SECRET).expect("key file");
    let acl = dir.join("acl.json");
    std::fs::write(&acl, ACL).expect("policy file");
    Settings {
        authentication: true,
        jwt_signature_type: Some(SignatureType::HS256),
        jwt_key_file: Some(key),
        authorization_policy_file: Some(acl),
        ..Settings::default()
    }
}

/// AUTHZ-8, AUTHZ-1: one identity's queue is out of another's reach on every backend — bob can
/// neither receive from nor send to alice's queue, and alice gets all her messages — also in
/// front of a real KubeMQ, which serves any token.
#[test]
fn authz_8_one_clients_queue_is_out_of_anothers_reach_on_every_backend() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (alice, bob) = (token("alice"), token("bob"));
    TestConnector::each_backend(secured(dir.path()), |c| {
        run_client_script(
            "python3",
            DIR,
            &["auth.py", "isolated", "{port}", &alice, &bob],
            "isolated",
            c.addr,
        );
    });
}

/// AUTHZ-7: a wildcard events subscription gets only the channels its identity may read, with
/// the backend's own wildcard matching (KubeMQ's, on the real server).
#[test]
fn authz_7_wildcard_subscriptions_follow_the_policy_on_every_backend() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (alice, app) = (token("alice"), token("app"));
    TestConnector::each_backend(secured(dir.path()), |c| {
        run_client_script(
            "python3",
            DIR,
            &["auth.py", "wildcard", "{port}", &alice, &app],
            "wildcard",
            c.addr,
        );
    });
}

/// KubeMQ's own policy for the enforcing build: alice may use channel `a` on every pattern,
/// under her ClientID or one that begins with it and a dash (events-store subscriptions).
const KUBEMQ_POLICY: &str = r#"[
  {"Queues": true, "Events": true, "EventsStore": true, "Commands": true, "Queries": true,
   "ClientID": "^alice($|-)", "Channel": "^a$", "Read": true, "Write": true}
]"#;

/// AUTHZ-9: where KubeMQ authorizes (the build before community v2.4.0), every call made for a
/// client carries that client's ClientID, so KubeMQ's policy decides: alice uses channel `a` on
/// queues, events and events-store (durable too), and on channel `b`, which only the connector
/// would allow, every send is rejected and every receiver detached with
/// `amqp:unauthorized-access`; no event is accepted that KubeMQ then refuses.
#[test]
fn authz_9_a_kubemq_that_authorizes_decides_by_the_clients_own_client_id() {
    use interop_tests::real_kubemq::{enforcing_binary, for_this_test};
    let Some(binary) = for_this_test("enforcing-kubemq", enforcing_binary()) else {
        return;
    };
    testkit::logs::used_secret(SECRET);
    let kubemq = interop_tests::real_kubemq::RealKubemq::start_with(
        &binary,
        &[
            ("AUTHENTICATION_ENABLE", "true"),
            ("AUTHENTICATION_JWT_CONFIG_KEY", SECRET),
            ("AUTHENTICATION_JWT_CONFIG_SIGNATURE_TYPE", "HS256"),
            ("AUTHORIZATION_ENABLE", "true"),
            ("AUTHORIZATION_POLICY_DATA", KUBEMQ_POLICY),
        ],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("jwt.key");
    std::fs::write(&key, SECRET).expect("key file");
    let settings = Settings {
        authentication: true,
        jwt_signature_type: Some(SignatureType::HS256),
        jwt_key_file: Some(key),
        authorize_every_client: true,
        kubemq_token: Some(token("kubemq-amqp-connector")),
        ..Settings::default()
    };
    let c = TestConnector::start_over_kubemq(settings, &kubemq);
    let alice = token("alice");
    let run = std::panic::catch_unwind(|| {
        run_client_script(
            "python3",
            DIR,
            &["auth.py", "kubemq-authorizes", "{port}", &alice],
            "kubemq-authorizes",
            c.addr,
        )
    });
    // KMQ-23: the read check a Get loop makes before it watches an idle queue gets the same
    // verdict from KubeMQ's policy, with no Get.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
        use connector::backend::{Backend, BackendError, ReadCheck};
        interop_tests::runtime().block_on(async {
            let options = GrpcOptions {
                token: Some(alice.clone()),
                ..GrpcOptions::default()
            };
            let grpc = KubemqGrpc::connect(&kubemq.grpc.to_string(), options).unwrap();
            assert_eq!(
                grpc.check_read("a", "alice").await.unwrap(),
                ReadCheck::Allowed
            );
            let refused = grpc.check_read("b", "alice").await;
            assert!(
                matches!(refused, Err(BackendError::Unauthorized(_))),
                "{refused:?}"
            );
        })
    }));
    if let Err(panic) = run.and(checked) {
        eprintln!("KubeMQ's log:\n{}", kubemq.log());
        std::panic::resume_unwind(panic);
    }
}
