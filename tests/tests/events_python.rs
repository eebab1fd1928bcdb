//! python-qpid-proton against the real connector: events and events-store scenarios
//! (tests/python/events.py) on every backend — the embedded store, gRPC to the store's façade,
//! and gRPC to the façade imitating KubeMQ v2.4 — and the restart of a durable subscription
//! on the embedded store.

use connector::config::Settings;
use interop_tests::{run_client_script, TestConnector};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");

/// Runs a scenario on each backend; `check` then looks at the connector.
fn each(settings: Settings, scenario: &str, check: impl Fn(&TestConnector)) {
    TestConnector::each_backend(settings, |c| {
        run_client_script(
            "python3",
            DIR,
            &["events.py", scenario, "{url}"],
            scenario,
            c.addr,
        );
        check(c);
    });
}

fn run(scenario: &str) {
    each(Settings::default(), scenario, |_| {});
}

/// EV-1, EV-2, EV-4, EV-7, EV-9, EV-14: fan-out to three subscribers, counted per pattern; the
/// subscriptions end with their links (on every backend the store behind it holds none after).
#[test]
fn ev_9_fan_out_to_three() {
    each(Settings::default(), "fanout", |c| {
        let out = c.metrics.transfers_counted("out", "events");
        assert_eq!(out, 30, "EV-14: 3 × 10 deliveries counted");
        assert_eq!(c.metrics.transfers_counted("in", "events"), 10);
        // A real KubeMQ does not count its subscriptions; the links gauge checked when the
        // connector is dropped covers the connector's side there.
        if let Some(store) = c.store_if_any() {
            testkit::eventually(
                "EV-4: every subscription ended with its link",
                std::time::Duration::from_secs(5),
                || store.events().subscriptions() == 0,
            );
        }
    });
}

/// EV-3, EV-5, EV-13: unsettled publishes are accepted; deliveries are pre-settled; nothing
/// published without a subscription is delivered later.
#[test]
fn ev_3_unsettled_publish_accepted() {
    run("unsettled");
}

/// GRP-1, GRP-2, GRP-5: two groups and an ungrouped subscriber; no SHARED-SUBS.
#[test]
fn grp_2_groups_share_and_fan_out() {
    run("groups");
}

/// Events wildcard subscriptions, fed by an anonymous link (ADDR-18).
#[test]
fn ev_wildcards_through_an_anonymous_link() {
    run("wildcard");
}

/// SEL-1, SEL-2, SEL-4, SEL-9, EV-10: the selector vector; the filter echoed; withheld events
/// are not drops.
#[test]
fn sel_9_selector_vector() {
    each(Settings::default(), "selectors", |c| {
        assert_eq!(c.metrics.events_dropped_no_credit.get(), 0, "EV-10");
    });
}

/// SEL-3, SEL-5: refused selectors.
#[test]
fn sel_5_bad_selectors_refused() {
    run("bad_selector");
}

/// EV-6: events at zero credit are dropped and counted, never delivered later.
#[test]
fn ev_6_zero_credit_drops_and_counts() {
    each(Settings::default(), "zero_credit", |c| {
        assert_eq!(c.metrics.events_dropped_no_credit.get(), 5);
    });
}

/// EV-12, ES-9: drains complete promptly.
#[test]
fn ev_12_drain() {
    run("drain");
}

/// ES-1, ES-2, ES-3, ES-4, ES-6, ES-10, SP-1, SP-3, SP-4, SP-9: start positions, counted under
/// the events-store pattern.
#[test]
fn sp_9_start_positions() {
    each(Settings::default(), "start_positions", |c| {
        assert_eq!(c.metrics.transfers_counted("in", "events-store"), 7);
        assert_eq!(
            c.metrics.transfers_counted("out", "events-store"),
            6 + 3 + 6 + 1 + 6 + 1
        );
    });
}

/// SP-7, EV-11: malformed start positions refused; ignored on events.
#[test]
fn sp_7_bad_start_refused() {
    run("bad_start");
}

/// DUR-1, DUR-4, DUR-5, DUR-6, DUR-8, DUR-9, DUR-10 on the embedded store (DUR-9 needs a
/// backend that can delete a subscription: KubeMQ's API cannot, see docs/decisions.md).
#[test]
fn dur_4_durable_resume_and_unsubscribe() {
    let c = TestConnector::start(Settings::default());
    run_client_script(
        "python3",
        DIR,
        &["events.py", "durable", "{url}"],
        "durable",
        c.addr,
    );
}

/// ES-5, ES-7: a stalled events-store subscriber is detached at the bound, the discarded
/// messages counted.
#[test]
fn es_7_stalled_subscriber_detached() {
    let settings = Settings {
        max_unsettled_per_link: 4,
        ..Settings::default()
    };
    each(settings, "stalled", |c| {
        assert_eq!(c.metrics.events_store_dropped_stalled.get(), 5);
    });
}

/// GRP-3, ES-8, SEL-2: groups and selectors on events-store, replayed history included.
#[test]
fn es_8_groups_and_selectors_on_the_store() {
    run("store_groups");
}

/// GRP-4: a group member without credit loses its share; the drops are counted and every
/// event was either delivered or dropped.
#[test]
fn grp_4_zero_credit_member_drops_its_share() {
    each(Settings::default(), "group_zero_credit", |c| {
        let dropped = c.metrics.events_dropped_no_credit.get();
        let delivered = c.metrics.transfers_counted("out", "events");
        assert!(dropped > 0, "the idle member's share was dropped");
        assert_eq!(dropped + delivered, 10);
    });
}
