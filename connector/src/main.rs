//! The connector binary: reads the settings, binds the plain and TLS listeners and serves until
//! SIGTERM or Ctrl-C, then closes every connection with `amqp:connection:forced`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use connector::auth::Security;
use connector::backend::embedded::Embedded;
use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::{readiness, Backend};
use connector::bridge::Bridge;
use connector::config::Cli;
use connector::config::Settings;
use connector::driver::{serve, Listeners, ServeOptions, TlsSource};
use connector::http::Health;
use connector::metrics::Metrics;
use connector::observed::Observing;
use connector::operations::Operations;
use connector::store::Store;

/// glibc's malloc cost the connector about a tenth of its CPU per message (mostly frees across
/// threads); mimalloc keeps thread-local free lists.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match cli.settings(|k| std::env::var(k).ok()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    ops::logs::init(settings.log_format);
    if cli.print_config {
        match serde_yaml::to_string(&settings) {
            Ok(y) => print!("{y}"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    if !settings.enable {
        tracing::info!("Enable is false: no listener is bound (CFG-18)");
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        // Spans go out over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
        let spans = match connector::spans::start(|k| std::env::var(k).ok()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot export spans");
                return ExitCode::from(2);
            }
        };
        let code = run(settings).await;
        spans.finish().await;
        code
    })
}

/// Binds the AMQP listeners, opens the backend and serves until a shutdown signal.
async fn run(settings: Settings) -> ExitCode {
    let security = match Security::load(&settings).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the authentication settings");
            return ExitCode::from(2);
        }
    };
    if settings.authentication {
        tracing::info!(
            signature = ?settings.jwt_signature_type,
            policy = settings.authorization_policy_file.is_some(),
            every_client_everywhere = settings.authorize_every_client,
            "clients authenticate with KubeMQ JWTs (SASL PLAIN) or client certificates (EXTERNAL)"
        );
    }
    tracing::info!(
        bytes = settings.process_memory(),
        from = if settings.max_process_memory.is_some() {
            "MaxProcessMemory"
        } else if connector::cgroup::memory_limit().is_some() {
            "half the container's memory limit"
        } else {
            "default"
        },
        "process memory budget"
    );
    let listener = match bind(&settings).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    // The backend: a KubeMQ over gRPC when an address is given, else the embedded store.
    let Some(kubemq) = settings.kubemq_address.clone() else {
        return run_embedded(listener, settings, security).await;
    };
    let opts = GrpcOptions::from_settings(&settings);
    let backend = match KubemqGrpc::connect(&kubemq, opts) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "invalid KubeMQ settings");
            return ExitCode::from(2);
        }
    };
    let probe = backend.clone();
    tokio::spawn(async move {
        match probe.ping().await {
            Ok(p) => {
                tracing::info!(address = %kubemq, version = %p.version, host = %p.host, "KubeMQ reachable")
            }
            Err(e) => tracing::warn!(address = %kubemq, error = %e, "KubeMQ not reachable yet"),
        }
    });
    serve_amqp(listener, &settings, security, backend).await
}

/// The plain listener on `Port` (unless 0) and the TLS listener on `TlsPort` when TLS is
/// configured (TLS-1); a file or address that does not work stops the connector here.
async fn bind(settings: &Settings) -> Result<Listeners, ExitCode> {
    let tcp = |port: u16, what: &'static str| async move {
        let addr = SocketAddr::new(settings.bind_address, port);
        match ops::listen::listen(addr) {
            Ok(l) => {
                tracing::info!(%addr, "{what} listener ready");
                Ok(l)
            }
            Err(e) => {
                tracing::error!(%addr, error = %e, "cannot bind the {what} listener");
                Err(ExitCode::FAILURE)
            }
        }
    };
    let mut listeners = Listeners::default();
    if settings.port != 0 {
        listeners.plain = Some(tcp(settings.port, "AMQP 1.0").await?);
    }
    if let Some(files) = settings.tls_files() {
        let source = match TlsSource::load(files) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot use the TLS files");
                return Err(ExitCode::from(2));
            }
        };
        let mode = if source.mutual() { "mtls" } else { "tls" };
        let l = tcp(settings.tls_port, "AMQP 1.0 over TLS").await?;
        tracing::info!(mode, "TLS listener uses TLS 1.2 and 1.3");
        listeners.tls = Some((l, Arc::new(source)));
        if settings.port != 0 {
            // TLS-7: configuring TLS does not close the plain port, where PLAIN passwords (JWTs
            // with authentication on) travel in cleartext; say so once, at start.
            tracing::warn!(
                port = settings.port,
                authentication = settings.authentication,
                "the plain AMQP listener stays open beside TLS: clients on it send their SASL PLAIN passwords (JWTs) in cleartext; set Port to 0 to serve TLS only"
            );
        }
    }
    Ok(listeners)
}

/// Runs on the embedded store, optionally serving it as KubeMQ's gRPC API too.
async fn run_embedded(listener: Listeners, settings: Settings, security: Security) -> ExitCode {
    let store = match Store::open(&settings.data_dir) {
        Ok((store, report)) => {
            tracing::info!(dir = %settings.data_dir.display(), ready = report.ready, delayed = report.delayed, dropped = report.dropped.len(), "embedded store open");
            store
        }
        Err(e) => {
            tracing::error!(dir = %settings.data_dir.display(), error = %e, "cannot open the embedded store");
            return ExitCode::FAILURE;
        }
    };
    store.start_delay_releaser();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let grpc = match settings.serve_kubemq_grpc {
        Some(gaddr) => match tokio::net::TcpListener::bind(gaddr).await {
            Ok(l) => {
                tracing::info!(addr = %gaddr, tokens = security.jwt.is_some(), "serving the embedded store as KubeMQ gRPC");
                let mut rx = stop_rx.clone();
                Some(tokio::spawn(connector::facade::serve(
                    store.clone(),
                    l,
                    security.jwt.clone(),
                    async move {
                        let _ = rx.changed().await;
                    },
                )))
            }
            Err(e) => {
                tracing::error!(addr = %gaddr, error = %e, "cannot bind the KubeMQ gRPC listener");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let code = serve_amqp(listener, &settings, security, Embedded::new(store.clone())).await;
    let _ = stop_tx.send(true);
    if let Some(mut g) = grpc {
        // A graceful stop waits for every open stream, and a KubeMQ client's subscriptions and
        // downstream sessions end only when it hangs up: past the grace they are cut, as a
        // stopping KubeMQ cuts them.
        if tokio::time::timeout(GRPC_STOP_GRACE, &mut g).await.is_err() {
            tracing::warn!(grace = ?GRPC_STOP_GRACE, "gRPC clients still attached after the grace; closing their streams");
            g.abort();
            let _ = g.await;
        }
    }
    store.close();
    code
}

/// How long a stopping connector lets the gRPC façade's clients end their streams themselves.
const GRPC_STOP_GRACE: Duration = Duration::from_secs(5);

/// Serves AMQP with the queues bridge over `backend` until SIGTERM or Ctrl-C.
async fn serve_amqp<B: Backend + Clone>(
    listener: Listeners,
    settings: &Settings,
    security: Security,
    backend: B,
) -> ExitCode {
    let metrics = Arc::new(Metrics::new());
    // Ready = the AMQP listener is bound (it is, here) and the backend answers a ping; the same
    // state admits connections (CONN-15) and, lost, closes them (CONN-16).
    let ready = readiness::watch(Arc::new(backend.clone())).await;
    let registry = Arc::new(connector::detail::Registry::default());
    let cfg = Arc::new(settings.engine_config(security.auth));
    if let Some(addr) = settings.http_address {
        match ops::listen::listen(addr) {
            Ok(l) => {
                tracing::info!(%addr, "serving /metrics, /metrics/operations, /livez, /readyz and /api/amqp10/{{connections,links,stages}}");
                tokio::spawn(connector::http::serve(
                    l,
                    Health {
                        metrics: metrics.clone(),
                        ready: ready.clone(),
                        registry: registry.clone(),
                        operations: Operations {
                            budget: cfg.process_memory.clone(),
                            max_connections: settings.max_connections,
                            tls: listener.tls.as_ref().map(|(_, source)| source.clone()),
                        },
                    },
                ));
            }
            Err(e) => {
                tracing::error!(%addr, error = %e, "cannot bind the HTTP endpoint");
                return ExitCode::FAILURE;
            }
        }
    }
    let opts = ServeOptions {
        max_connections: settings.max_connections,
        shutdown_grace: Duration::from_secs(10),
        broker_ready: Some(ready.clone()),
    };
    let bridge = Bridge::new(backend, settings, metrics, security.access);
    serve(
        listener,
        cfg,
        opts,
        Arc::new(Observing::new(bridge, registry)),
        shutdown_signal(),
    )
    .await;
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
