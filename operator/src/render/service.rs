//! The clients' Service (AMQP ports only, so a LoadBalancer never exposes metrics) and the
//! metrics Service a ServiceMonitor scrapes.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{http_port, selector_labels};
use crate::crd::{AmqpConnectorSpec, ServiceType, SessionAffinity, TrafficPolicy};

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
                name: Some("metrics".into()),
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
