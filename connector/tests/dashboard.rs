//! The chart's Grafana dashboard against the connector binary: every metric a panel's query
//! names is one the connector serves on `/metrics` or `/metrics/operations` (with TLS on, so
//! the certificate gauge is there too), and the failure counters it shows count a failed TLS
//! handshake; and a real Prometheus (built from its Go module by tests/prometheus/build.sh)
//! that scrapes a connector under load has data for every panel's query, which the test plots
//! panel by panel into `target/dashboard/dashboard.svg` (README shows a copy).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::pki::Pki;
use common::{free_port, start_connector, wait_listening, Reaper};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../helm/amqp-connector-operator/dashboards/amqp-connector.json"
);

/// The names of the samples an exposition carries (`name{labels} value` or `name value`).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The metric names in a PromQL query: the connector's prefixes, up to the first character
/// that cannot be in a name.
fn named_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("kubemq_amqp") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

fn scrape(http: SocketAddr, path: &str) -> String {
    let reply = testkit::http_get(http, path).expect("answered");
    assert_eq!(reply.status, 200, "{path}: {reply:?}");
    reply.body
}

/// The value of the sample `name` (without labels) in `text`.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
}

/// The connector with a TLS port and its HTTP endpoint, stopped when dropped.
struct Served {
    _connector: Reaper,
    _data: tempfile::TempDir,
    _pki: Pki,
    amqp_port: u16,
    tls_port: u16,
    http: SocketAddr,
}

fn start() -> Served {
    let pki = Pki::new("dashboard CA");
    pki.issue("server", "127.0.0.1", 41, false, false);
    let data = tempfile::tempdir().unwrap();
    let amqp_port = free_port();
    let tls_port = free_port();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let connector = Reaper(vec![start_connector(
        data.path(),
        amqp_port,
        &[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--http-address",
            &http.to_string(),
        ],
    )]);
    wait_listening(tls_port);
    Served {
        _connector: connector,
        _data: data,
        _pki: pki,
        amqp_port,
        tls_port,
        http,
    }
}

/// Every panel's queries, as (title, expression).
fn queries() -> Vec<(String, String)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push((
                panel["title"].as_str().unwrap().to_string(),
                target["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

#[test]
fn every_metric_the_dashboard_names_is_served() {
    let c = start();
    let (http, tls_port) = (c.http, c.tls_port);

    // The connection that saw the TLS port listen closed without a handshake: that is one
    // failure; a client that speaks no TLS is the second.
    let failures = "kubemq_amqp_connector_tls_handshake_failures_total";
    let reaches = |n: u64| {
        (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            value(&scrape(http, "/metrics/operations"), failures) == Some(n)
        })
    };
    assert!(reaches(1), "{}", scrape(http, "/metrics/operations"));
    let mut bad = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = bad.read(&mut [0u8; 64]);
    drop(bad);
    assert!(reaches(2), "{}", scrape(http, "/metrics/operations"));
    // The per-channel family has series only for channels that carried a message.
    load(c.amqp_port, Duration::from_millis(50));

    let served: BTreeSet<String> = sample_names(&scrape(http, "/metrics"))
        .into_iter()
        .chain(sample_names(&scrape(http, "/metrics/operations")))
        .collect();
    let mut named = BTreeSet::new();
    for (title, expr) in queries() {
        let names = named_metrics(&expr);
        assert!(!names.is_empty(), "{title}: {expr}");
        for name in names {
            assert!(
                served.contains(&name),
                "{title}: {name} is not served; served: {served:?}"
            );
            named.insert(name);
        }
    }
    // Every family of the connector's own has a panel, but the stage histogram's sum and count.
    let unshown: Vec<&String> = served
        .iter()
        .filter(|s| !named.contains(*s))
        .filter(|s| !s.starts_with("kubemq_amqp_connector_queue_stage_seconds_"))
        .collect();
    assert!(unshown.is_empty(), "no panel shows {unshown:?}");
}

/// One panel query's answer: the series that carry a number.
#[derive(Debug)]
struct Answer {
    title: String,
    query: String,
    series: Vec<Series>,
}

/// One series of an instant query.
#[derive(Debug)]
struct Series {
    labels: serde_json::Value,
    value: f64,
}

/// `GET path` from a Prometheus at `addr`: its status and whole body.
fn prometheus_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    testkit::http_get(addr, path).map(|r| (r.status, r.body))
}

/// A query string's value: every byte but letters and digits percent-encoded.
fn encoded(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Queue traffic with every outcome, and events, for `for_how_long`.
fn load(amqp_port: u16, for_how_long: Duration) {
    use fe2o3_amqp::types::messaging::{Message, Outcome};
    use fe2o3_amqp::{Connection, Receiver, Sender, Session};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("amqp://127.0.0.1:{amqp_port}");
        let mut conn = Connection::open("dashboard-load", url.as_str())
            .await
            .unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut queue = Sender::attach(&mut session, "tx", "queues/dashboard")
            .await
            .unwrap();
        let mut events = Sender::attach(&mut session, "ev", "events/dashboard")
            .await
            .unwrap();
        let mut consumer = Receiver::attach(&mut session, "rx", "queues/dashboard")
            .await
            .unwrap();
        let until = tokio::time::Instant::now() + for_how_long;
        let mut n = 0u64;
        while tokio::time::Instant::now() < until {
            let outcome = queue.send(Message::from(format!("m{n}"))).await.unwrap();
            assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
            events.send(Message::from(format!("e{n}"))).await.unwrap();
            let delivery = consumer.recv::<String>().await.unwrap();
            // Mostly accepted; now and then released (it comes back) or rejected.
            match n % 10 {
                3 => {
                    consumer.release(&delivery).await.unwrap();
                    let again = consumer.recv::<String>().await.unwrap();
                    consumer.accept(&again).await.unwrap();
                }
                7 => consumer.reject(&delivery, None).await.unwrap(),
                _ => consumer.accept(&delivery).await.unwrap(),
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        consumer.close().await.unwrap();
        queue.close().await.unwrap();
        events.close().await.unwrap();
        session.end().await.unwrap();
        conn.close().await.unwrap();
    });
}

/// A real Prometheus scrapes a connector's `/metrics` and `/metrics/operations` as the job
/// `amqp-connector` (as the operator's ServiceMonitor has it) while queue messages and events
/// flow and are settled every way; then every panel's query, with the dashboard's variables
/// filled in, returns at least one series with a number.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs Prometheus, built from its Go module: tests/run.sh"
)]
fn a_real_prometheus_has_data_for_every_panel() {
    let prometheus = std::env::var_os("PROMETHEUS")
        .expect("PROMETHEUS names the Prometheus binary (tests/run.sh builds it)");
    let c = start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    // As the operator's ServiceMonitor has it: one job, the pages told apart by `endpoint`.
    let job = |name: &str, path: &str, page: &str| {
        format!(
            "  - job_name: {name}\n    metrics_path: {path}\n    scrape_interval: 1s\n    \
             static_configs:\n      - targets: ['{}']\n        labels: {{job: amqp-connector, \
             pod: amqp-connector-0, endpoint: {page}}}\n",
            c.http
        )
    };
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{}{}",
            job("connector", "/metrics", "metrics"),
            job("connector-operations", "/metrics/operations", "operations")
        ),
    )
    .unwrap();
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (_, log) = testkit::logs::file("prometheus");
    let server = std::process::Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(std::process::Stdio::from(log.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(log))
        .spawn()
        .unwrap();
    let _prometheus = Reaper(vec![server]);
    testkit::eventually("Prometheus is ready", Duration::from_secs(60), || {
        prometheus_get(web, "/-/ready").is_some_and(|(status, _)| status == 200)
    });

    // Both pages scraped once before the load, so the plot starts from the quiet connector.
    let up = format!("/api/v1/query?query={}", encoded("count(up == 1)"));
    let scraped = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        prometheus_get(web, &up).is_some_and(|(_, body)| body.contains(r#","2"]"#))
    });
    assert!(scraped, "{:?}", prometheus_get(web, &up));
    let began = unix_seconds();
    std::thread::sleep(Duration::from_secs(3));
    load(c.amqp_port, Duration::from_secs(12));
    // One more scrape, so the last second of the load is in.
    std::thread::sleep(Duration::from_millis(1500));
    let ended = unix_seconds();

    let mut answers: Vec<Answer> = Vec::new();
    for (title, expr) in queries() {
        let filled = expr
            .replace("$__rate_interval", "15s")
            .replace("$job", "amqp-connector")
            .replace("$pod", ".*");
        let (status, body) =
            prometheus_get(web, &format!("/api/v1/query?query={}", encoded(&filled)))
                .expect("Prometheus answers");
        assert_eq!(status, 200, "{title}: {filled}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        let series = answer["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let value = s["value"][1].as_str()?.parse::<f64>().ok()?;
                value.is_finite().then(|| Series {
                    labels: s["metric"].clone(),
                    value,
                })
            })
            .collect();
        answers.push(Answer {
            title,
            query: filled,
            series,
        });
    }
    let empty: Vec<String> = answers
        .iter()
        .filter(|a| a.series.is_empty())
        .map(|a| format!("{}: {}", a.title, a.query))
        .collect();
    assert!(empty.is_empty(), "no data:\n{}", empty.join("\n"));
    // What the load did shows: every outcome, queue traffic both ways, every stage's time.
    let positive = |title: &str, label: &str| -> BTreeSet<String> {
        answers
            .iter()
            .filter(|a| a.title == title)
            .flat_map(|a| a.series.iter())
            .filter(|s| s.value > 0.0)
            .filter_map(|s| s.labels[label].as_str().map(str::to_string))
            .collect()
    };
    let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert!(
        positive("Settlement outcomes", "outcome")
            .is_superset(&set(&["accepted", "released", "rejected"])),
        "{answers:?}"
    );
    assert!(
        positive("Messages per second by pattern", "pattern")
            .is_superset(&set(&["queues", "events"])),
        "{answers:?}"
    );
    assert!(
        positive("Queue message stages, p99", "stage").is_superset(&set(&[
            "stored",
            "waited",
            "handed_out",
            "settled"
        ])),
        "{answers:?}"
    );

    let panels = plotted(web, began, ended);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard");
    std::fs::create_dir_all(&out).unwrap();
    plot(&panels, &out.join("dashboard.svg"), ended - began);
    assert!(
        panels
            .iter()
            .all(|p| p.lines.iter().any(|l| l.points.len() >= 5)),
        "every panel has a line of several points"
    );
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One panel as plotted: its title and a line per series.
struct Panel {
    title: String,
    lines: Vec<Line>,
}

/// One series over the load: its legend and its points (seconds since the start, value).
struct Line {
    legend: String,
    points: Vec<(f64, f64)>,
}

/// Every panel's queries over `began..ended`, a point a second, with the panel's legends.
fn plotted(web: SocketAddr, began: f64, ended: f64) -> Vec<Panel> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let mut lines = Vec::new();
        for target in panel["targets"].as_array().unwrap() {
            let filled = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5s")
                .replace("$job", "amqp-connector")
                .replace("$pod", ".*");
            let path = format!(
                "/api/v1/query_range?query={}&start={began:.3}&end={ended:.3}&step=1",
                encoded(&filled)
            );
            let (status, body) = prometheus_get(web, &path).expect("Prometheus answers");
            assert_eq!(status, 200, "{filled}: {body}");
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            for series in answer["data"]["result"].as_array().into_iter().flatten() {
                let mut legend = target["legendFormat"].as_str().unwrap_or("").to_string();
                for (k, v) in series["metric"].as_object().into_iter().flatten() {
                    legend = legend.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or(""));
                }
                let points = series["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| {
                        let t = p[0].as_f64()?;
                        let v = p[1].as_str()?.parse::<f64>().ok()?;
                        v.is_finite().then_some((t - began, v))
                    })
                    .collect();
                lines.push(Line { legend, points });
            }
        }
        panels.push(Panel {
            title: panel["title"].as_str().unwrap().to_string(),
            lines,
        });
    }
    panels
}

/// The panels as a grid of line charts, four across, in an SVG file at `path`.
fn plot(panels: &[Panel], path: &std::path::Path, seconds: f64) {
    use plotters::prelude::*;
    let rows = panels.len().div_ceil(4);
    let root = SVGBackend::new(path, (1600, 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    for (area, panel) in root.split_evenly((rows, 4)).iter().zip(panels) {
        let top = panel
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        let top = if top > 0.0 { top * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(22)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..seconds, 0.0..top)
            .unwrap();
        chart
            .configure_mesh()
            .x_labels(5)
            .y_labels(5)
            .x_desc("s")
            .draw()
            .unwrap();
        for (i, line) in panel.lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .unwrap()
                .label(line.legend.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11))
            .draw()
            .unwrap();
    }
    root.present().unwrap();
}
