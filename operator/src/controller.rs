//! The reconcile loop: one AmqpConnector in, its children applied with server-side apply under
//! one field manager, children it no longer wants deleted, and its status written only when it
//! changed. An invalid or unsupported spec is a permanent condition (Degraded, no retry spin);
//! API errors are transient (per-object exponential backoff).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::crd::{AmqpConnector, AmqpConnectorStatus, Endpoints};
use crate::events::{Announcement, Announcer, EventType};
use crate::monitoring::ServiceMonitor;
use crate::render::{self, RenderError, MANAGER};

/// What reconciles share.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Kubernetes Events about AmqpConnectors.
    announcer: Announcer,
    /// Consecutive failures per object, for backoff.
    failures: Mutex<HashMap<ObjectRef<AmqpConnector>, u32>>,
    /// Counters for `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Whether this installation makes ServiceMonitors (and may touch them at all).
    service_monitors: bool,
}

impl Context {
    /// A context around `client`; `instance` names this replica in the Events it publishes;
    /// `service_monitors` says whether it was granted ServiceMonitors.
    pub fn new(
        client: Client,
        metrics: crate::metrics::Metrics,
        instance: Option<String>,
        service_monitors: bool,
    ) -> Context {
        Context {
            announcer: Announcer::new(client.clone(), MANAGER, instance),
            client,
            failures: Mutex::new(HashMap::new()),
            metrics,
            service_monitors,
        }
    }
}

/// Why a reconcile failed (transient: retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{0}: {1}")]
    Api(&'static str, #[source] kube::Error),
    /// The object is not namespaced (the CRD says it must be).
    #[error("the AmqpConnector has no namespace")]
    NoNamespace,
    /// A ServiceMonitor is asked for where the Prometheus operator's CRD is not installed:
    /// retried, as installing it needs no change to the AmqpConnector.
    #[error(
        "spec.metrics.serviceMonitor: this cluster does not serve ServiceMonitor \
         (monitoring.coreos.com/v1); install the Prometheus operator's CRDs or turn it off"
    )]
    NoServiceMonitorCrd,
    /// A ServiceMonitor is asked for from an installation that was not granted them.
    #[error(
        "spec.metrics.serviceMonitor: this operator was installed without ServiceMonitors; \
         upgrade its chart with --set connectorServiceMonitors.enabled=true or turn it off"
    )]
    ServiceMonitorsOff,
}

impl Error {
    /// The `Degraded` condition's reason while this error stops a reconcile.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NoServiceMonitorCrd => "ServiceMonitorCRDMissing",
            Error::ServiceMonitorsOff => "ServiceMonitorsOff",
            Error::Api(..) | Error::NoNamespace => "ApplyFailed",
        }
    }

    /// The error as a condition's or an Event's message: the API server's own words (what
    /// failed, its message, reason and code), never a dump of its response.
    pub fn for_people(&self) -> String {
        match self {
            Error::Api(what, kube::Error::Api(s)) => {
                format!("{what}: {} ({} {})", s.message, s.reason, s.code)
            }
            other => other.to_string(),
        }
    }
}

/// How long a healthy object waits before the next drift check.
const RESYNC: Duration = Duration::from_secs(600);
/// First and largest retry delay after failures.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Reconciles one AmqpConnector.
pub async fn reconcile(cr: Arc<AmqpConnector>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let result = reconcile_once(cr, &ctx).await;
    // A failed one is done once error_policy has scheduled its retry.
    if result.is_ok() {
        ctx.metrics.reconciles_done.inc();
    }
    result
}

async fn reconcile_once(cr: Arc<AmqpConnector>, ctx: &Context) -> Result<Action, Error> {
    let ns = cr.namespace().ok_or(Error::NoNamespace)?;
    let name = cr.name_any();
    if cr.metadata.deletion_timestamp.is_some() {
        // Being deleted: the garbage collector removes the children (in the foreground before
        // the object itself); applying them again would keep a foreground deletion from ending.
        tracing::info!(%ns, %name, "being deleted; leaving the children to the garbage collector");
        return Ok(Action::await_change());
    }
    if cr.spec.paused == Some(true) {
        tracing::info!(%ns, %name, "paused; not reconciling");
        let was_paused = paused_condition(cr.status.as_ref()).is_some();
        if !was_paused {
            let event = Announcement {
                type_: EventType::Normal,
                reason: "Paused".into(),
                note: "spec.paused is true: the children are left as they are".into(),
                action: "Reconcile".into(),
            };
            if let Err(e) = ctx.announcer.publish(&event, &cr.object_ref(&())).await {
                tracing::warn!(%ns, %name, error = %e, "cannot publish an event");
            }
        }
        write_status(&cr, &ns, paused_status(&cr), ctx).await?;
        return Ok(Action::await_change());
    }
    let result = apply_children(&cr, &ns, ctx).await;
    let status = match &result {
        Ok((deployment, hash)) => observed(&cr, deployment.as_ref(), None, Some(hash)),
        Err(failure) => {
            let degraded = match failure {
                Failure::Spec(e) => ("InvalidSpec", e.to_string()),
                Failure::Api(e) => (e.reason(), e.for_people()),
            };
            // Nothing new was applied, but the pods of the last good spec may be serving.
            let running = running_deployment(&cr, &ns, ctx).await;
            observed(&cr, running.as_ref(), Some(degraded), None)
        }
    };
    announce(&cr, &status, ctx).await;
    write_status(&cr, &ns, status, ctx).await?;
    match result {
        Ok(_) => {
            ctx.failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ObjectRef::from_obj(cr.as_ref()));
            Ok(rerun_after(RESYNC, ctx))
        }
        Err(Failure::Spec(e)) => {
            tracing::warn!(%ns, %name, error = %e, "invalid spec; waiting for a change");
            ctx.metrics.invalid_specs.inc();
            Ok(Action::await_change())
        }
        Err(Failure::Api(e)) => Err(e),
    }
}

/// The Deployment this AmqpConnector already runs, if it can be read.
async fn running_deployment(cr: &AmqpConnector, ns: &str, ctx: &Context) -> Option<Deployment> {
    let uid = cr.metadata.uid.as_deref().unwrap_or_default();
    match Api::<Deployment>::namespaced(ctx.client.clone(), ns)
        .get_opt(&cr.name_any())
        .await
    {
        Ok(found) => found.filter(|d| controlled_by(&d.metadata, uid)),
        Err(e) => {
            tracing::warn!(%ns, name = %cr.name_any(), error = %e, "cannot read the Deployment");
            None
        }
    }
}

/// Retries a failed object with exponential backoff.
pub fn error_policy(cr: Arc<AmqpConnector>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.errors.inc();
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures
        .entry(ObjectRef::from_obj(cr.as_ref()))
        .or_insert(0);
    *n = n.saturating_add(1);
    let delay = FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(16)))
        .min(MAX_BACKOFF);
    tracing::warn!(name = %cr.name_any(), %error, ?delay, "reconcile failed; retrying");
    ctx.metrics.reconciles_done.inc();
    rerun_after(delay, &ctx)
}

/// Schedules the object's next reconcile after `delay`, counted so that a timed re-run shows.
fn rerun_after(delay: Duration, ctx: &Context) -> Action {
    ctx.metrics.timed_reruns.inc();
    Action::requeue(delay)
}

/// Why children could not be applied.
enum Failure {
    /// The spec cannot be applied as it is (it does not render, or the API server refuses what
    /// it renders): permanent until the spec changes.
    Spec(String),
    /// The API failed: transient, retried with backoff.
    Api(Error),
}

/// Applies every wanted child and deletes the unwanted ones; returns the applied Deployment
/// (with the status the server holds) and the configuration hash.
async fn apply_children(
    cr: &AmqpConnector,
    ns: &str,
    ctx: &Context,
) -> Result<(Option<Deployment>, String), Failure> {
    let d = render::desired(cr).map_err(|e: RenderError| Failure::Spec(e.to_string()))?;
    let uid = cr.metadata.uid.clone().unwrap_or_default();
    let client = ctx.client.clone();
    let name = cr.name_any();
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        &d.config_map,
    )
    .await?;
    let deployment = apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        &d.deployment,
    )
    .await?;
    let services = Api::<Service>::namespaced(client.clone(), ns);
    apply(&services, &d.service).await?;
    match &d.metrics_service {
        Some(s) => {
            apply(&services, s).await?;
        }
        None => remove(&services, &format!("{name}-metrics"), &uid).await?,
    }
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
    match &d.pdb {
        Some(p) => {
            apply(&pdbs, p).await?;
        }
        None => remove(&pdbs, &name, &uid).await?,
    }
    // Last: where it cannot be made, everything else is in place while it is retried.
    let monitors = Api::<ServiceMonitor>::namespaced(client, ns);
    match &d.service_monitor {
        Some(_) if !ctx.service_monitors => return Err(Failure::Api(Error::ServiceMonitorsOff)),
        // Without the grant there is none of ours to delete, and asking would be refused.
        None if !ctx.service_monitors => {}
        Some(m) => {
            apply(&monitors, m).await.map_err(|f| match f {
                Failure::Api(Error::Api(_, kube::Error::Api(s))) if s.code == 404 => {
                    Failure::Api(Error::NoServiceMonitorCrd)
                }
                f => f,
            })?;
        }
        None => remove(&monitors, &name, &uid).await?,
    }
    Ok((Some(deployment), d.config_hash))
}

/// Server-side apply of `obj` (forced: this operator owns these fields).
async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Failure>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut body = serde_json::to_value(obj)
        .map_err(|e| Failure::Api(Error::Api("serialize", kube::Error::SerdeError(e))))?;
    // Apply bodies name their type.
    if let Some(fields) = body.as_object_mut() {
        fields.insert("apiVersion".into(), K::api_version(&()).into());
        fields.insert("kind".into(), K::kind(&()).into());
    }
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| match e {
        // Invalid (422): what the spec renders is refused, and will be until the spec changes.
        kube::Error::Api(s) if s.code == 422 => {
            Failure::Spec(format!("{} {name} refused: {}", K::kind(&()), s.message))
        }
        e => Failure::Api(Error::Api("apply", e)),
    })
}

/// Deletes a child that is no longer wanted; gone already is fine, and so is a kind the cluster
/// does not serve (a ServiceMonitor without the Prometheus operator).
async fn remove<K>(api: &Api<K>, name: &str, owner_uid: &str) -> Result<(), Failure>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(obj)) if controlled_by(obj.meta(), owner_uid) => api
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(s) if s.code == 404 => Ok(()),
                e => Err(e),
            })
            .map_err(|e| Failure::Api(Error::Api("delete", e))),
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Failure::Api(Error::Api("get", e))),
    }
}

/// Whether the AmqpConnector with `owner_uid` controls the object: labels alone would let one
/// AmqpConnector delete another's child of the same name (`foo-metrics`, say).
fn controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    owner_uid: &str,
) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// The `Paused=True` condition of `status`, if it has one.
fn paused_condition(status: Option<&AmqpConnectorStatus>) -> Option<&Condition> {
    status?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Paused" && c.status == "True")
}

/// The status of a paused object: what was observed before, and `Paused=True` (which the next
/// unpaused reconcile drops, as it writes the conditions it computes).
fn paused_status(cr: &AmqpConnector) -> AmqpConnectorStatus {
    let mut status = cr.status.clone().unwrap_or_default();
    let since = paused_condition(cr.status.as_ref())
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    let mut conditions = status.conditions.take().unwrap_or_default();
    conditions.retain(|c| c.type_ != "Paused");
    conditions.push(Condition {
        type_: "Paused".into(),
        status: "True".into(),
        reason: "Paused".into(),
        message: "spec.paused is true: the children are left as they are".into(),
        observed_generation: cr.metadata.generation,
        last_transition_time: since,
    });
    status.conditions = Some(conditions);
    status
}

/// Why the Deployment's rollout failed, in its own words.
struct RolloutFailure {
    reason: String,
    message: String,
}

/// A Deployment condition by type.
fn deployment_condition<'a>(
    d: &'a Deployment,
    kind: &str,
) -> Option<&'a k8s_openapi::api::apps::v1::DeploymentCondition> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
}

/// The Deployment cannot make its pods (`ReplicaFailure`: a missing Secret or ServiceAccount,
/// a quota) or made no progress within its deadline (`ProgressDeadlineExceeded`).
fn rollout_failure(d: &Deployment) -> Option<RolloutFailure> {
    let failure = deployment_condition(d, "ReplicaFailure")
        .filter(|c| c.status == "True")
        .or_else(|| deployment_condition(d, "Progressing").filter(|c| c.status == "False"))?;
    Some(RolloutFailure {
        reason: failure
            .reason
            .clone()
            .unwrap_or_else(|| failure.type_.clone()),
        message: failure.message.clone().unwrap_or_default(),
    })
}

/// The status this reconcile observed. Conditions keep their transition time while their status
/// does not change, so an unchanged world writes nothing.
fn observed(
    cr: &AmqpConnector,
    deployment: Option<&Deployment>,
    degraded: Option<(&str, String)>,
    hash: Option<&String>,
) -> AmqpConnectorStatus {
    let old = cr.status.clone().unwrap_or_default();
    let generation = cr.metadata.generation;
    let name = cr.name_any();
    let ns = cr.namespace().unwrap_or_default();
    // While a spec cannot be applied, the pods that run are the last good spec's: counted from
    // its Deployment, or as observed before when it could not be read.
    let want = match (&degraded, deployment) {
        (Some(_), Some(d)) => d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        (Some(_), None) => old.replicas.unwrap_or(cr.spec.replicas),
        (None, _) => cr.spec.replicas,
    };
    let ds = deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let current = deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.observed_generation)
        .zip(deployment.and_then(|d| d.metadata.generation))
        .is_some_and(|(seen, gen)| seen >= gen);
    let ready = match (&degraded, deployment) {
        (Some(_), None) => old.ready_replicas.unwrap_or(0),
        _ => ds.ready_replicas.unwrap_or(0),
    };
    let updated = ds.updated_replicas.unwrap_or(0);
    let (mut conds, mut status) = (Vec::new(), AmqpConnectorStatus::default());
    let cond = |t: &str, ok: bool, reason: &str, message: String| {
        let previous = old
            .conditions
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.type_ == t));
        let s = if ok { "True" } else { "False" };
        let since = match previous {
            Some(p) if p.status == s => p.last_transition_time.clone(),
            _ => Time(k8s_openapi::jiff::Timestamp::now()),
        };
        Condition {
            type_: t.into(),
            status: s.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    match &degraded {
        Some((reason, message)) => {
            conds.push(cond("Ready", false, reason, message.clone()));
            conds.push(cond("Degraded", true, reason, message.clone()));
            status = AmqpConnectorStatus {
                replicas: deployment.map_or(old.replicas, |_| Some(ds.replicas.unwrap_or(0))),
                ready_replicas: deployment.map_or(old.ready_replicas, |_| Some(ready)),
                updated_replicas: deployment.map_or(old.updated_replicas, |_| Some(updated)),
                config_hash: old.config_hash.clone(),
                image: old.image.clone(),
                ..status
            };
        }
        None => {
            let all = want > 0 && ready >= want && updated >= want && current;
            let failed = deployment.and_then(rollout_failure);
            conds.push(cond(
                "Ready",
                all,
                if all {
                    "AllReplicasReady"
                } else {
                    "ReplicasNotReady"
                },
                format!("{ready}/{want} pods ready"),
            ));
            conds.push(match &failed {
                // The Deployment's own reason: pods cannot be made, or no progress in time.
                Some(f) => cond("Degraded", true, &f.reason, f.message.clone()),
                None => cond(
                    "Degraded",
                    false,
                    "Reconciled",
                    "the spec is applied".into(),
                ),
            });
            status.replicas = Some(ds.replicas.unwrap_or(0));
            status.ready_replicas = Some(ready);
            status.updated_replicas = Some(updated);
            status.config_hash = hash.cloned();
            status.image = Some(
                cr.spec
                    .image
                    .clone()
                    .unwrap_or_else(|| render::DEFAULT_IMAGE.into()),
            );
        }
    }
    let available = want > 0 && ready > 0;
    conds.push(cond(
        "Available",
        available,
        if want == 0 {
            "ScaledToZero"
        } else if available {
            "MinimumReplicasAvailable"
        } else {
            "NoReplicasAvailable"
        },
        format!("{ready} of {want} pods ready"),
    ));
    let stalled = deployment
        .and_then(|d| deployment_condition(d, "Progressing"))
        .filter(|c| c.status == "False");
    let rolling =
        degraded.is_none() && stalled.is_none() && (!current || updated < want || ready < want);
    conds.push(match stalled {
        Some(c) => cond(
            "Progressing",
            false,
            c.reason.as_deref().unwrap_or("ProgressDeadlineExceeded"),
            c.message.clone().unwrap_or_default(),
        ),
        None => cond(
            "Progressing",
            rolling,
            if rolling { "RollingOut" } else { "Complete" },
            format!("{updated} of {want} pods on the current template"),
        ),
    });
    status.conditions = Some(conds);
    status.observed_generation = generation;
    status.selector = Some(render::selector_string(&name));
    status.service_name = Some(name.clone());
    let listeners = &cr.spec.listeners;
    let amqps = render::amqps(&cr.spec).is_some();
    status.endpoints = (listeners.amqp.enabled || amqps).then(|| Endpoints {
        amqp: listeners
            .amqp
            .enabled
            .then(|| format!("amqp://{name}.{ns}.svc:{}", listeners.amqp.port)),
        amqps: amqps.then(|| format!("amqps://{name}.{ns}.svc:{}", listeners.amqps.port)),
    });
    status
}

/// Publishes an Event for a real change: Normal `Applied` when a new generation of the spec was
/// applied, Warning with the Degraded reason when the object becomes degraded or its reason or
/// message changes. Nothing for a reconcile that found everything as it was.
async fn announce(cr: &AmqpConnector, status: &AmqpConnectorStatus, ctx: &Context) {
    let degraded = |s: Option<&AmqpConnectorStatus>| {
        s.and_then(|s| s.conditions.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == "Degraded" && c.status == "True")
            })
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let event = match degraded(Some(status)) {
        Some(now) if degraded(cr.status.as_ref()) != Some(now.clone()) => Announcement {
            type_: EventType::Warning,
            reason: now.0,
            note: now.1,
            action: "Reconcile".into(),
        },
        Some(_) => return,
        None if cr.status.as_ref().and_then(|s| s.observed_generation)
            != cr.metadata.generation =>
        {
            Announcement {
                type_: EventType::Normal,
                reason: "Applied".into(),
                note: format!(
                    "generation {} applied (configuration {})",
                    cr.metadata.generation.unwrap_or(0),
                    status.config_hash.as_deref().unwrap_or("-")
                ),
                action: "Apply".into(),
            }
        }
        None => return,
    };
    if let Err(e) = ctx.announcer.publish(&event, &cr.object_ref(&())).await {
        tracing::warn!(name = %cr.name_any(), error = %e, "cannot publish an event");
    }
}

/// Writes `status` unless the object already has it (a write that changes nothing would wake
/// every watcher and, on some servers, the controller itself).
async fn write_status(
    cr: &AmqpConnector,
    ns: &str,
    status: AmqpConnectorStatus,
    ctx: &Context,
) -> Result<(), Error> {
    if cr.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api = Api::<AmqpConnector>::namespaced(ctx.client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": AmqpConnector::api_version(&()),
        "kind": AmqpConnector::kind(&()),
        "status": status,
    });
    api.patch_status(
        &cr.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|e| Error::Api("status", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};

    fn example() -> AmqpConnector {
        let text = include_str!("../../examples/amqpconnector.yaml");
        text.split("\n---\n")
            .find(|d| d.contains("kind: AmqpConnector"))
            .map(|d| serde_yaml::from_str(d).expect("the example's AmqpConnector"))
            .expect("an AmqpConnector in the example")
    }

    fn condition<'a>(s: &'a AmqpConnectorStatus, type_: &str) -> &'a Condition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    /// An API failure reads as the API server's message, reason and code, not as a dump.
    #[test]
    fn an_api_failure_reads_as_the_servers_words() {
        let status = kube::core::Status {
            code: 500,
            message: "quantities must match the regular expression".into(),
            reason: "InternalError".into(),
            ..Default::default()
        };
        let e = Error::Api("apply", kube::Error::Api(Box::new(status)));
        assert_eq!(
            e.for_people(),
            "apply: quantities must match the regular expression (InternalError 500)"
        );
    }

    /// A spec that cannot be applied leaves the last good spec's pods serving: the status
    /// counts them from their Deployment and says they are available.
    #[test]
    fn an_invalid_spec_reports_the_pods_that_still_serve() {
        let mut cr = example();
        cr.spec.replicas = 5;
        let running = Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(3),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                replicas: Some(3),
                ready_replicas: Some(3),
                updated_replicas: Some(3),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = observed(
            &cr,
            Some(&running),
            Some(("InvalidSpec", "spec.x: unsupported".into())),
            None,
        );
        assert_eq!(condition(&s, "Available").status, "True");
        assert_eq!(condition(&s, "Available").message, "3 of 3 pods ready");
        assert_eq!(condition(&s, "Ready").status, "False");
        assert_eq!(condition(&s, "Degraded").reason, "InvalidSpec");
        assert_eq!(s.ready_replicas, Some(3));
        assert_eq!(s.replicas, Some(3));
        // With no Deployment read, what was observed before stands.
        cr.status = Some(s.clone());
        let again = observed(&cr, None, Some(("ApplyFailed", "timeout".into())), None);
        assert_eq!(condition(&again, "Available").status, "True");
        assert_eq!(again.ready_replicas, Some(3));
    }
}
