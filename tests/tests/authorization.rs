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
