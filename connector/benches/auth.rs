//! What authentication and authorization cost: one JWT check as a PLAIN login makes it (HS256
//! and ES256), and one authorization decision from the cache and from Casbin.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(missing_docs)] // criterion_group! makes a public function

use connector::auth::jwt::{JwtVerifier, KeySource, SignatureType};
use connector::auth::policy::{Action, Policy};
use connector::engine::TokenVerifier;
use connector::pattern::Pattern;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

const ACL: &str = r#"[
  {"Queues": true, "ClientID": "^orders-svc$", "Channel": "^orders$", "Read": false, "Write": true},
  {"Queues": true, "ClientID": "^billing$", "Channel": "^(orders|billing)$", "Read": true, "Write": true},
  {"Queues": true, "Events": true, "ClientID": "^audit-", "Channel": ".*", "Read": true}
]"#;

fn claims() -> serde_json::Value {
    serde_json::json!({"ClientID": "orders-svc", "exp": 4_102_444_800_u64})
}

fn bench(c: &mut Criterion) {
    let hs = JwtVerifier::new(SignatureType::HS256, KeySource::Inline("bench-secret")).unwrap();
    let hs_token = encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(b"bench-secret"),
    )
    .unwrap();
    c.bench_function("jwt_check_hs256", |b| {
        b.iter(|| hs.verify(black_box(&hs_token)).unwrap())
    });

    let pair = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256
    let es = JwtVerifier::new(
        SignatureType::ES256,
        KeySource::Inline(&pair.public_key_pem()),
    )
    .unwrap();
    let es_token = encode(
        &Header::new(Algorithm::ES256),
        &claims(),
        &EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    c.bench_function("jwt_check_es256", |b| {
        b.iter(|| es.verify(black_box(&es_token)).unwrap())
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let policy = rt.block_on(Policy::from_text(ACL)).unwrap();
    c.bench_function("authz_cached", |b| {
        b.iter(|| {
            policy.allows(
                "billing",
                Pattern::Queues,
                black_box("orders"),
                Action::Read,
            )
        })
    });
    // A new channel each time (the cache holds 1024): Casbin decides every one.
    let channels: Vec<String> = (0..4096).map(|i| format!("orders-{i}")).collect();
    let mut i = 0;
    c.bench_function("authz_casbin", |b| {
        b.iter(|| {
            i = (i + 1) % channels.len();
            policy.allows("audit-7", Pattern::Queues, &channels[i], Action::Read)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
