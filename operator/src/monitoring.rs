//! The Prometheus operator's ServiceMonitor (`monitoring.coreos.com/v1`), with only the fields
//! this operator sets: which Services to scrape, on which port and paths, and what names the job.
//! Its CRD comes with the Prometheus operator; this one only writes objects of it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// What a ServiceMonitor scrapes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "monitoring.coreos.com",
    version = "v1",
    kind = "ServiceMonitor",
    namespaced,
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// The label of the selected Service whose value becomes the targets' `job` label.
    pub job_label: String,
    /// The Services of the ServiceMonitor's namespace to scrape.
    pub selector: LabelSelector,
    /// One scrape of every selected Service per endpoint.
    pub endpoints: Vec<Endpoint>,
}

/// One scrape of every selected Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The name of the Service's port; a Service without it is not scraped.
    pub port: String,
    /// The HTTP path.
    pub path: String,
    /// The scrape interval (Prometheus's own when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Changes to the targets' labels before the scrape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<Relabeling>,
}

/// One relabeling that sets a target label.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Relabeling {
    /// `replace`.
    pub action: String,
    /// The label set.
    pub target_label: String,
    /// Its value.
    pub replacement: String,
}
