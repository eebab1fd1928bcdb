//! The operator binary: waits to lead (a Lease, so only one replica reconciles), then watches
//! AmqpConnectors (all namespaces, or the one given) and their children and reconciles each;
//! serves `/livez`, `/readyz` and `/metrics`; on SIGTERM or Ctrl-C finishes the reconciles in
//! flight and releases the Lease.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use kubemq_amqp_operator::controller::{error_policy, reconcile, Context};
use kubemq_amqp_operator::crd::AmqpConnector;
use kubemq_amqp_operator::metrics::Metrics;
use kubemq_amqp_operator::render::MANAGER;
use tokio::sync::watch;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "kubemq-amqp-operator",
    version,
    about = "Operator for AmqpConnector resources"
)]
struct Args {
    /// Where `/livez`, `/readyz` and `/metrics` are served.
    #[arg(long, env = "OPERATOR_HTTP_ADDRESS", default_value = "0.0.0.0:8080")]
    http_address: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "OPERATOR_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Reconcile only while holding the Lease `--lease-name` (`false`: always).
    #[arg(long, env = "OPERATOR_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    leader_election: bool,
    /// Name of the Lease; one per installation (the chart uses its release's name), so that two
    /// installations in one namespace do not wait on each other.
    #[arg(long, env = "OPERATOR_LEASE_NAME", default_value = MANAGER)]
    lease_name: String,
    /// Namespace of the Lease: the operator's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's name in the Lease.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Log lines as `text` or `json` (one object per line); verbosity follows `RUST_LOG`.
    #[arg(long, env = "OPERATOR_LOG_FORMAT", default_value = "text")]
    log_format: ops::logs::LogFormat,
    /// Make the ServiceMonitors AmqpConnectors ask for; the chart passes `true` only with
    /// `connectorServiceMonitors.enabled`, which grants it ServiceMonitors.
    #[arg(long, env = "OPERATOR_SERVICE_MONITORS", default_value_t = false, action = ArgAction::Set)]
    service_monitors: bool,
}

/// Seconds a leader's Lease stays valid without renewal.
const LEASE_SECONDS: u64 = 15;
/// How old this replica's last renewal of the Lease may be before it stops reconciling: just
/// short of the Lease's expiry, after which another replica may take it.
const RENEW_DEADLINE: Duration = Duration::from_secs(LEASE_SECONDS - 1);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    ops::logs::init(args.log_format);
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes API: neither in-cluster config nor a kubeconfig");
            return ExitCode::FAILURE;
        }
    };
    let listener = match ops::listen::listen(args.http_address) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(address = %args.http_address, error = %e, "cannot serve /livez, /readyz, /metrics");
            return ExitCode::FAILURE;
        }
    };
    let metrics = Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn(kubemq_amqp_operator::http::serve(
        listener,
        metrics.clone(),
        ready.clone(),
    ));
    let ns = args.watch_namespace.as_deref();
    tokio::spawn(mark_ready(api::<AmqpConnector>(&client, ns), ready));
    let stop = stop_signal();

    // Standing by until this replica leads (a standby is ready, just not reconciling).
    let mut lease = None;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("operator-{}", std::process::id()));
    if args.leader_election {
        match lead(
            &client,
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            stop.clone(),
        )
        .await
        {
            Ok(Some(l)) => lease = Some(l),
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "leader election failed");
                return ExitCode::FAILURE;
            }
        }
    }
    let leading = lease.as_ref().map(|(rx, _)| Leadership {
        leading: rx.clone(),
        confirmed: tokio::spawn(until_hold_unconfirmed(
            Api::namespaced(client.clone(), &args.lease_namespace),
            args.lease_name.clone(),
            identity.clone(),
        )),
    });
    let leading_gauge = metrics.leading.clone();
    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics,
        args.identity.clone(),
        args.service_monitors,
    ));
    leading_gauge.set(1);
    reconcile_until(client, ns, ctx, stop.clone(), leading).await;
    leading_gauge.set(0);
    let lost = !*stop.borrow();
    if let Some((rx, task)) = lease {
        // Closing the channel makes the lease manager release the Lease and finish.
        drop(rx);
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("lease released"),
            other => tracing::warn!(?other, "lease not released cleanly"),
        }
    }
    if lost {
        // Another replica leads now; start over as a standby.
        tracing::warn!("leadership lost; exiting so the pod restarts as a standby");
        return ExitCode::FAILURE;
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// A channel that turns true on SIGTERM or Ctrl-C.
fn stop_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = tx.send(true);
    });
    rx
}

async fn until_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn until_false(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| !*v).await;
}

type Lease = (
    watch::Receiver<bool>,
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
);

/// Waits until this replica holds the Lease `lease`; `None` when stopped first.
async fn lead(
    client: &Client,
    namespace: &str,
    lease: &str,
    identity: &str,
    stop: watch::Receiver<bool>,
) -> Result<Option<Lease>, kube_lease_manager::LeaseManagerError> {
    let manager = LeaseManagerBuilder::new(client.clone(), lease)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(5)
        .with_field_manager(format!("{MANAGER}-{identity}"))
        .build()
        .await?;
    let (rx, task) = manager.watch().await;
    tracing::info!(%identity, "waiting to lead");
    tokio::select! {
        _ = until_true(rx.clone()) => {
            tracing::info!(%identity, "leading");
            Ok(Some((rx, task)))
        }
        _ = until_true(stop) => Ok(None),
    }
}

/// What ends this replica's leadership: the lease manager says so, or the task confirming the
/// hold ([`until_hold_unconfirmed`]) ends.
struct Leadership {
    leading: watch::Receiver<bool>,
    confirmed: tokio::task::JoinHandle<()>,
}

/// Completes once this replica's hold on Lease `name` cannot be confirmed any more: another
/// holder is named, or the last renewal seen is older than [`RENEW_DEADLINE`]. The lease manager
/// keeps reporting leadership while its renewals fail (the API unreachable, the right to renew
/// gone), and past the Lease's expiry another replica may lead: this one must stop first.
async fn until_hold_unconfirmed(leases: Api<LeaseObject>, name: String, identity: String) {
    let mut valid_until = k8s_openapi::jiff::Timestamp::now()
        .checked_add(RENEW_DEADLINE)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        match leases.get(&name).await {
            Ok(l) => {
                let spec = l.spec.unwrap_or_default();
                if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                    tracing::warn!(lease = %name, holder = ?spec.holder_identity, "the Lease names another holder");
                    return;
                }
                // The renewal time is written by this replica's own clock: no skew to allow for.
                if let Some(renewed) = spec
                    .renew_time
                    .and_then(|t| t.0.checked_add(RENEW_DEADLINE).ok())
                {
                    valid_until = renewed;
                }
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot read the Lease to confirm the hold")
            }
        }
        if k8s_openapi::jiff::Timestamp::now() > valid_until {
            tracing::warn!(lease = %name, deadline = ?RENEW_DEADLINE, "the hold on the Lease cannot be confirmed: not renewed within the deadline");
            return;
        }
    }
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

/// Ready once the API answers a list of AmqpConnectors (reachable, CRD installed, allowed).
async fn mark_ready(crs: Api<AmqpConnector>, ready: Arc<AtomicBool>) {
    loop {
        match crs.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => {
                ready.store(true, Ordering::Release);
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot list AmqpConnectors yet"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs the controller until stopped or, with a Lease, until leadership is lost.
async fn reconcile_until(
    client: Client,
    ns: Option<&str>,
    ctx: Arc<Context>,
    stop: watch::Receiver<bool>,
    leading: Option<Leadership>,
) {
    // Only our own children are watched: a smaller cache, and nobody else's objects wake us.
    let ours =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let shutdown = async move {
        match leading {
            Some(l) => tokio::select! {
                _ = until_true(stop) => {}
                _ = until_false(l.leading) => {}
                _ = l.confirmed => {}
            },
            None => until_true(stop).await,
        }
    };
    Controller::new(
        api::<AmqpConnector>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .owns(api::<ConfigMap>(&client, ns), ours.clone())
    .owns(api::<Deployment>(&client, ns), ours.clone())
    .owns(api::<Service>(&client, ns), ours.clone())
    .owns(api::<PodDisruptionBudget>(&client, ns), ours)
    .graceful_shutdown_on(shutdown)
    .run(reconcile, error_policy, ctx)
    .for_each(|r| {
        match r {
            // error_policy has logged it, with its retry.
            Err(e @ kube::runtime::controller::Error::ReconcilerFailed(..)) => {
                tracing::debug!(error = %e, "reconcile failed")
            }
            // The watches and the queue: nothing else would report them.
            Err(e) => tracing::warn!(error = %e, "controller error"),
            Ok(_) => {}
        }
        futures::future::ready(())
    })
    .await;
}
