//! Qpid JMS (Maven Central) against the real connector over real sockets, on both backends: the
//! Queues concept page's Java program as the page writes it (its address comes from
//! `KUBEMQ_AMQP_URL`, as the page reads it), and the scenarios of `tests/java`. `tests/run.sh`
//! compiles them into `tests/java/target/classes` and writes the dependency class path to
//! `tests/java/target/classpath.txt`; a missing build fails these tests.

use connector::config::Settings;
use interop_tests::TestConnector;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/java");

fn classpath() -> String {
    let deps = std::fs::read_to_string(format!("{DIR}/target/classpath.txt"))
        .expect("tests/run.sh builds tests/java and writes target/classpath.txt");
    format!("{DIR}/target/classes:{}", deps.trim())
}

/// Runs `class args` with `java` against `c`; returns its standard output after checking it
/// exited 0.
fn java(c: &TestConnector, class: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("java")
        .env("KUBEMQ_AMQP_URL", c.url())
        .arg("-cp")
        .arg(classpath())
        .arg(class)
        .args(args)
        .output()
        .expect("java is installed");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{class} {args:?} on the {} backend:\n{stdout}\n{}",
        c.backend(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn scenario(name: &str) {
    TestConnector::each_backend(Settings::default(), |c| {
        let out = java(c, "Scenarios", &[name, &c.url()]);
        assert!(out.contains(&format!("PASS {name}")), "{out}");
    });
}

/// Q-S1 with Qpid JMS: the page's program sends 10 messages, each confirmed, consumes and
/// acknowledges them, and finds the queue empty.
#[test]
fn q_s1_the_concept_pages_java_program() {
    TestConnector::each_backend(Settings::default(), |c| {
        let out = java(c, "Main", &[]);
        assert!(out.contains("consumed and accepted 10 messages"), "{out}");
        assert_eq!(c.queue_depth("amqp10.examples.basic"), 0);
    });
}

/// confirmed sends, in-order first deliveries, acknowledge removes.
#[test]
fn qpid_jms_send_receive_acknowledge() {
    scenario("basic");
}

/// Competing consumers on two connections: every message once, none twice.
#[test]
fn qpid_jms_competing_consumers() {
    scenario("competing");
}

/// a released message comes back marked redelivered.
#[test]
fn qpid_jms_release_and_redelivery() {
    scenario("release");
}

/// a rejected message never comes back.
#[test]
fn qpid_jms_reject() {
    scenario("reject");
}

/// a consumer that leaves unacknowledged loses nothing.
#[test]
fn qpid_jms_teardown() {
    scenario("teardown");
}

/// EV-9, SEL-1, SEL-4 with Qpid JMS topics: fan-out, and a selector JMS trusts because the
/// reply ATTACH echoes it.
#[test]
fn ev_9_qpid_jms_topic_subscribers_and_selector() {
    TestConnector::each_backend(Settings::default(), |c| {
        let out = java(c, "EventsScenarios", &["topic", &c.url()]);
        assert!(out.contains("PASS topic"), "{out}");
    });
}

/// DUR-1, DUR-4, DUR-9, OP-ES-6 with Qpid JMS durable subscriptions: resume after close, and
/// `unsubscribe` (on the embedded store: KubeMQ's API cannot delete a subscription).
#[test]
fn dur_9_qpid_jms_durable_subscription_and_unsubscribe() {
    let c = TestConnector::start(Settings::default());
    let out = java(&c, "EventsScenarios", &["durable", &c.url()]);
    assert!(out.contains("PASS durable"), "{out}");
}
