//! The clients' Service (AMQP ports only, so a LoadBalancer never exposes metrics), the metrics
//! Service, and the ServiceMonitor that has the Prometheus operator scrape it.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{http_port, selector_labels};
use crate::crd::{AmqpConnectorSpec, ServiceType, SessionAffinity, TrafficPolicy};
use crate::monitoring::{Endpoint, Relabeling, ServiceMonitor, ServiceMonitorSpec};

/// The name of the metrics Service's port, which the ServiceMonitor's endpoints name.
const METRICS_PORT: &str = "metrics";

/// The Service `name` AMQP clients connect to.
pub fn amqp_service(name: &str, spec: &AmqpConnectorSpec, mut meta: ObjectMeta) -> Service {
    let opts = spec.service.clone().unwrap_or_default();
    if let Some(extra) = &opts.labels {
        let mut labels = extra.clone();
        labels.extend(meta.labels.take().unwrap_or_default());
        meta.labels = Some(labels);
    }
    meta.annotations = opts.annotations.clone();
    // Each listener's port is named for its protocol: the container port it targets and its
    // appProtocol carry the same name.
    let listener = |name: &str, port: i32, node_port: Option<i32>| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        app_protocol: Some(name.into()),
        protocol: Some("TCP".into()),
        node_port,
    };
    let node_ports = opts.node_ports.as_ref();
    let mut ports = Vec::new();
    if spec.listeners.amqp.enabled {
        let amqp = &spec.listeners.amqp;
        ports.push(listener("amqp", amqp.port, node_ports.and_then(|n| n.amqp)));
    }
    if super::amqps(spec).is_some() {
        let amqps = &spec.listeners.amqps;
        ports.push(listener(
            "amqps",
            amqps.port,
            node_ports.and_then(|n| n.amqps),
        ));
    }
    let type_ = opts.type_.map(|t| {
        match t {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
        .to_string()
    });
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some(type_.unwrap_or_else(|| "ClusterIP".into())),
            selector: Some(selector_labels(name)),
            ports: Some(ports),
            load_balancer_class: opts.load_balancer_class.clone(),
            load_balancer_source_ranges: opts.load_balancer_source_ranges.clone(),
            external_traffic_policy: opts.external_traffic_policy.map(|p| {
                match p {
                    TrafficPolicy::Cluster => "Cluster",
                    TrafficPolicy::Local => "Local",
                }
                .into()
            }),
            session_affinity: opts.session_affinity.map(|a| {
                match a {
                    SessionAffinity::None => "None",
                    SessionAffinity::ClientIP => "ClientIP",
                }
                .into()
            }),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The ClusterIP Service `<name>-metrics` in front of `/metrics`.
pub fn metrics_service(name: &str, spec: &AmqpConnectorSpec, meta: ObjectMeta) -> Service {
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(name)),
            ports: Some(vec![ServicePort {
                name: Some(METRICS_PORT.into()),
                port: http_port(spec),
                target_port: Some(IntOrString::String("http".into())),
                app_protocol: Some("http".into()),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The ServiceMonitor `<name>` for the metrics Service: both of the connector's metrics paths
/// (`/metrics` and `/metrics/operations`, which the chart's alerts need together), with the
/// job named by `app.kubernetes.io/name`, so every connector is the job `amqp-connector`, and
/// the label `endpoint` telling the two pages apart (`metrics`, `operations`).
pub fn service_monitor(
    name: &str,
    spec: &AmqpConnectorSpec,
    mut meta: ObjectMeta,
) -> Option<ServiceMonitor> {
    let opts = spec
        .metrics
        .as_ref()
        .filter(|m| m.enabled)?
        .service_monitor
        .as_ref()
        .filter(|m| m.enabled)?;
    if let Some(extra) = &opts.labels {
        let mut labels = extra.clone();
        labels.extend(meta.labels.take().unwrap_or_default());
        meta.labels = Some(labels);
    }
    // Both paths are one port of one pod: without a label of their own, the two targets' `up`
    // (and other scrape series) would be one series written twice.
    let endpoint = |path: &str, name: &str| Endpoint {
        port: METRICS_PORT.into(),
        path: path.into(),
        interval: opts.interval.clone(),
        relabelings: vec![Relabeling {
            action: "replace".into(),
            target_label: "endpoint".into(),
            replacement: name.into(),
        }],
    };
    Some(ServiceMonitor {
        metadata: meta,
        spec: ServiceMonitorSpec {
            job_label: "app.kubernetes.io/name".into(),
            // The clients' Service has the same labels but no `metrics` port, so it has no
            // targets.
            selector: LabelSelector {
                match_labels: Some(selector_labels(name)),
                ..LabelSelector::default()
            },
            endpoints: vec![
                endpoint("/metrics", METRICS_PORT),
                endpoint("/metrics/operations", "operations"),
            ],
        },
    })
}
