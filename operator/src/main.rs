//! The operator binary: watches AmqpConnectors (all namespaces, or the ones given) and their
//! children, reconciles each, serves `/livez`, `/readyz` and `/metrics`, and stops on SIGTERM or
//! Ctrl-C after the reconciles in flight finish.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client};
use kubemq_amqp_operator::controller::{error_policy, reconcile, Context};
use kubemq_amqp_operator::metrics::Metrics;
use kubemq_amqp_operator::render::MANAGER;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "kubemq-amqp-operator",
    about = "Operator for AmqpConnector resources"
)]
struct Args {
    /// Where `/livez`, `/readyz` and `/metrics` are served.
    #[arg(long, env = "OPERATOR_HTTP_ADDRESS", default_value = "0.0.0.0:8080")]
    http_address: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "OPERATOR_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes API: neither in-cluster config nor a kubeconfig");
            return std::process::ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.http_address).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(address = %args.http_address, error = %e, "cannot serve /livez, /readyz, /metrics");
            return std::process::ExitCode::FAILURE;
        }
    };
    let metrics = Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn(kubemq_amqp_operator::http::serve(
        listener,
        metrics.clone(),
        ready.clone(),
    ));
    run(client, args.watch_namespace.as_deref(), metrics, ready).await;
    tracing::info!("stopped");
    std::process::ExitCode::SUCCESS
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn run(client: Client, ns: Option<&str>, metrics: Metrics, ready: Arc<AtomicBool>) {
    // Only our own children are watched: a smaller cache, and nobody else's objects wake us.
    let ours =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let controller = Controller::new(
        api::<kubemq_amqp_operator::crd::AmqpConnector>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .owns(api::<ConfigMap>(&client, ns), ours.clone())
    .owns(api::<Deployment>(&client, ns), ours.clone())
    .owns(api::<Service>(&client, ns), ours.clone())
    .owns(api::<PodDisruptionBudget>(&client, ns), ours)
    .shutdown_on_signal();
    let ctx = Arc::new(Context::new(client.clone(), metrics));
    // Ready once the API answers a list of AmqpConnectors (reachable, CRD installed, allowed).
    let crs = api::<kubemq_amqp_operator::crd::AmqpConnector>(&client, ns);
    let waiting = tokio::spawn(async move {
        loop {
            match crs.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => {
                    ready.store(true, Ordering::Release);
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot list AmqpConnectors yet"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
    });
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile result");
            }
            futures::future::ready(())
        })
        .await;
    waiting.abort();
}
