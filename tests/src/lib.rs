//! What the interop tests share: the real connector (driver, queues bridge, embedded store) on a
//! loopback port, on each backend ([`TestConnector`]); the store's gRPC façade ([`TestFacade`]);
//! the real KubeMQ server where its binary exists ([`real_kubemq`]); a broker a test stops and
//! starts again ([`restartable`]);
//! running a client program's scenario against it ([`run_client_script`]); and the fe2o3-amqp
//! links request/reply uses: a requester's reply node ([`reply_node`]) and a sender on the
//! anonymous relay ([`relay_sender`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use connector::config::Settings;
use connector::driver::{serve, ServeOptions};

pub mod fleet;
pub mod real_kubemq;
pub mod restartable;

/// A server running on its own runtime thread: the listener is bound before `spawn` returns; a
/// stop signal ends it, and dropping its runtime cuts every connection.
pub struct ServerThread {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Binds `bind` (port 0 for an ephemeral one) and runs `serve(listener, stop)` on a new
    /// two-worker runtime.
    pub fn spawn<F, Fut>(bind: SocketAddr, serve: F) -> ServerThread
    where
        F: FnOnce(tokio::net::TcpListener, tokio::sync::oneshot::Receiver<()>) -> Fut
            + Send
            + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = runtime();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(bind).await.expect("bind");
                addr_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                serve(listener, stop_rx).await;
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        let addr = addr_rx.recv().expect("server started");
        ServerThread {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Signals the stop and waits for the thread.
    pub fn halt(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A two-worker runtime for tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The embedded store served as KubeMQ's gRPC API on a loopback port, in its own runtime thread.
pub struct TestFacade {
    /// Where gRPC clients connect.
    pub addr: SocketAddr,
    /// The store, to inspect.
    pub store: Arc<connector::store::Store>,
    server: ServerThread,
    _dir: Option<tempfile::TempDir>,
}

impl TestFacade {
    /// Opens a store in a new temporary folder and serves it on an ephemeral port.
    pub fn start() -> TestFacade {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut f = Self::start_at(dir.path(), None);
        f._dir = Some(dir);
        f
    }

    /// Serves the store in `dir` on `addr` (or an ephemeral port). Stopping it drops its runtime:
    /// every connection is cut at once, as when a server dies.
    pub fn start_at(dir: &std::path::Path, addr: Option<SocketAddr>) -> TestFacade {
        Self::serve_at(dir, addr, false)
    }

    /// Like [`TestFacade::start`], with open transactions capturing messages as a real KubeMQ
    /// v2.4's do (`Facade::imitating_kubemq`): a stand-in for the real broker wherever its binary
    /// is absent, and a second, deterministic witness where it is present.
    pub fn start_imitating_kubemq() -> TestFacade {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut f = Self::serve_at(dir.path(), None, true);
        f._dir = Some(dir);
        f
    }

    /// Serves `store`, already open behind a connector on the embedded store, as KubeMQ's gRPC
    /// API as well (what `--serve-kubemq-grpc` does): the store then has subscribers of both
    /// kinds. Stopping the façade closes the store.
    pub fn serve_store(store: Arc<connector::store::Store>) -> TestFacade {
        Self::serve(store, None, false)
    }

    fn serve_at(dir: &std::path::Path, addr: Option<SocketAddr>, capture: bool) -> TestFacade {
        let (store, _) = connector::store::Store::open(dir).expect("store opens");
        Self::serve(store, addr, capture)
    }

    fn serve(
        store: Arc<connector::store::Store>,
        addr: Option<SocketAddr>,
        capture: bool,
    ) -> TestFacade {
        use connector::facade::{serve_facade, Facade};
        let served = store.clone();
        let server = ServerThread::spawn(
            addr.unwrap_or(testkit::ANY_LOOPBACK_PORT),
            move |listener, stop| async move {
                served.start_delay_releaser();
                let facade = if capture {
                    Facade::imitating_kubemq(served)
                } else {
                    Facade::new(served)
                };
                tokio::select! {
                    _ = serve_facade(facade, listener, None, std::future::pending()) => {}
                    _ = stop => {}
                }
            },
        );
        TestFacade {
            addr: server.addr,
            store,
            server,
            _dir: None,
        }
    }

    /// Stops serving and closes the store.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.server.halt();
        self.store.close();
    }
}

impl Drop for TestFacade {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The real connector — driver, queues bridge, embedded store in a temporary folder — on a
/// loopback port.
pub struct TestConnector {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Its metrics, to inspect.
    pub metrics: Arc<connector::metrics::Metrics>,
    /// The store behind it (none in front of a real KubeMQ).
    store: Option<Arc<connector::store::Store>>,
    server: ServerThread,
    _dir: tempfile::TempDir,
    _facade: Option<TestFacade>,
    kubemq: Option<real_kubemq::RealKubemq>,
    kind: Backend,
}

/// The backends a [`TestConnector`] can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Embedded,
    Grpc,
    KubemqLike,
    RealKubemq,
}

impl TestConnector {
    /// The gRPC façade of the store behind a connector started with `start_over_grpc`.
    pub fn facade_addr(&self) -> Option<SocketAddr> {
        self._facade.as_ref().map(|f| f.addr)
    }

    /// Runs `body` against a connector with `settings` on each backend in turn: the embedded
    /// store, gRPC to the store's façade, gRPC to the façade imitating KubeMQ v2.4's capture of
    /// messages by open transactions, and gRPC to a real KubeMQ where its binary exists
    /// ([`real_kubemq::binary`]); a failure says which backend it was on.
    pub fn each_backend(settings: Settings, body: impl Fn(&TestConnector)) {
        Self::each_of(&Self::backends(true), settings, body);
    }

    /// [`TestConnector::each_backend`] without the real KubeMQ, for a body that reads the
    /// broker's own state through [`TestConnector::store`] (ready and locked counts, waiting
    /// Gets), which KubeMQ does not expose.
    pub fn each_store_backend(settings: Settings, body: impl Fn(&TestConnector)) {
        Self::each_of(&Self::backends(false), settings, body);
    }

    /// One connector with `settings` on each backend of [`TestConnector::each_backend`], all
    /// running at once (for a body that loads them side by side).
    pub fn on_every_backend(settings: Settings) -> Vec<TestConnector> {
        Self::backends(true)
            .into_iter()
            .map(|b| Self::start_on(b, settings.clone()))
            .collect()
    }

    fn start_on(backend: Backend, settings: Settings) -> TestConnector {
        match backend {
            Backend::Embedded => Self::start(settings),
            Backend::Grpc => Self::start_over_grpc(settings),
            Backend::KubemqLike => Self::start_over_kubemq_like(settings),
            Backend::RealKubemq => {
                Self::start_over_real_kubemq(settings).expect("the binary was found a moment ago")
            }
        }
    }

    fn backends(real: bool) -> Vec<Backend> {
        let mut all = vec![Backend::Embedded, Backend::Grpc, Backend::KubemqLike];
        if real && real_kubemq::binary().is_some() {
            all.push(Backend::RealKubemq);
        }
        all
    }

    fn each_of(backends: &[Backend], settings: Settings, body: impl Fn(&TestConnector)) {
        for backend in backends {
            let c = Self::start_on(*backend, settings.clone());
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&c)));
            if let Err(panic) = run {
                eprintln!("failed on the {} backend", c.backend());
                if let Some(k) = &c.kubemq {
                    eprintln!("KubeMQ's log:\n{}", k.log());
                }
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// Starts one over gRPC to a real KubeMQ of its own ([`real_kubemq::RealKubemq`]), if the
    /// binary exists.
    pub fn start_over_real_kubemq(settings: Settings) -> Option<TestConnector> {
        let binary = real_kubemq::binary()?;
        let kubemq = real_kubemq::RealKubemq::start(&binary);
        let mut c = Self::start_over_kubemq(settings, &kubemq);
        c.kubemq = Some(kubemq);
        Some(c)
    }

    /// Starts one over gRPC to `kubemq`, which it shares with whatever else uses it.
    pub fn start_over_kubemq(
        settings: Settings,
        kubemq: &real_kubemq::RealKubemq,
    ) -> TestConnector {
        real_kubemq::record_use("real-kubemq");
        let mut c = Self::grpc_client(settings, None, kubemq.grpc);
        c.kind = Backend::RealKubemq;
        c
    }

    /// The store behind this connector, to inspect; a connector in front of a real KubeMQ has
    /// none (run such a body with [`TestConnector::each_store_backend`]).
    pub fn store(&self) -> &Arc<connector::store::Store> {
        self.store
            .as_ref()
            .expect("a real KubeMQ has no store to inspect: use each_store_backend")
    }

    /// The store behind this connector where there is one (not in front of a real KubeMQ), for
    /// a check of the store's own state that KubeMQ does not expose.
    pub fn store_if_any(&self) -> Option<&Arc<connector::store::Store>> {
        self.store.as_ref()
    }

    /// Messages in `channel`'s queue, ready or held by a consumer: on a store, counted; on a
    /// real KubeMQ, those a peek (`ReceiveQueueMessages` with `IsPeak`) sees within a second,
    /// which is everything once no consumer holds any.
    pub fn queue_depth(&self, channel: &str) -> usize {
        if let Some(store) = &self.store {
            return store.ready_count(channel) + store.locked_count(channel);
        }
        let kubemq = self.kubemq.as_ref().expect("a store or a real KubeMQ");
        let reply = receive_queue_messages(
            kubemq.grpc,
            connector::kubemq::ReceiveQueueMessagesRequest {
                request_id: "queue-depth".into(),
                client_id: "interop-tests-peek".into(),
                channel: channel.into(),
                max_number_of_messages: 1024,
                wait_time_seconds: 1,
                is_peak: true,
            },
        );
        // KubeMQ answers a peek of an empty queue with an error saying so.
        assert!(
            !reply.is_error || reply.messages.is_empty(),
            "peek failed: {}",
            reply.error
        );
        reply.messages.len()
    }

    /// Takes one message of `channel`'s queue straight from the broker, as a KubeMQ client sees
    /// it (tags included), waiting up to 2 s: from the store itself, or with
    /// `ReceiveQueueMessages` from the façade or the real KubeMQ.
    pub fn take_from_broker(&self, channel: &str) -> Option<connector::kubemq::QueueMessage> {
        if let Some(store) = &self.store {
            return runtime().block_on(async {
                let got = store.get(channel, 1, Duration::from_secs(2)).await;
                let seqs: Vec<_> = got.iter().map(|d| d.sequence).collect();
                store.ack(channel, &seqs);
                got.into_iter().next().map(|d| d.message)
            });
        }
        let addr = match (&self.kubemq, self.facade_addr()) {
            (Some(k), _) => k.grpc,
            (None, Some(f)) => f,
            (None, None) => panic!("a store, a façade or a real KubeMQ"),
        };
        receive_queue_messages(
            addr,
            connector::kubemq::ReceiveQueueMessagesRequest {
                request_id: "take-from-broker".into(),
                client_id: "interop-tests-take".into(),
                channel: channel.into(),
                max_number_of_messages: 1,
                wait_time_seconds: 2,
                is_peak: false,
            },
        )
        .messages
        .into_iter()
        .next()
    }

    /// The real KubeMQ behind this connector, if it is on that backend.
    pub fn real_kubemq(&self) -> Option<&real_kubemq::RealKubemq> {
        self.kubemq.as_ref()
    }

    /// Which backend this connector uses: `embedded`, `grpc`, `kubemq-like` or `real-kubemq`.
    pub fn backend(&self) -> &'static str {
        match self.kind {
            Backend::Embedded => "embedded",
            Backend::Grpc => "grpc",
            Backend::KubemqLike => "kubemq-like",
            Backend::RealKubemq => "real-kubemq",
        }
    }

    /// Starts one over gRPC to a façade imitating KubeMQ v2.4's capture
    /// ([`TestFacade::start_imitating_kubemq`]).
    pub fn start_over_kubemq_like(settings: Settings) -> TestConnector {
        let mut c = Self::over_grpc(settings, TestFacade::start_imitating_kubemq());
        c.kind = Backend::KubemqLike;
        c
    }

    /// Starts one on the embedded store with `settings` (the port is ignored).
    pub fn start(settings: Settings) -> TestConnector {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, _) = connector::store::Store::open(dir.path()).expect("store opens");
        let backend = connector::backend::embedded::Embedded::new(store.clone());
        Self::serve(settings, backend, store, dir, None)
    }

    /// Starts one whose backend is the KubeMQ gRPC client, talking to the store's façade over
    /// loopback: the same tests then run "KubeMQ over gRPC".
    pub fn start_over_grpc(settings: Settings) -> TestConnector {
        Self::over_grpc(settings, TestFacade::start())
    }

    /// Starts one over gRPC to `facade`, which it shares with whatever else uses it (another
    /// connector: two replicas of the connector in front of one broker).
    pub fn start_over_facade(settings: Settings, facade: &TestFacade) -> TestConnector {
        Self::grpc_client(settings, Some(facade.store.clone()), facade.addr)
    }

    fn over_grpc(settings: Settings, facade: TestFacade) -> TestConnector {
        let mut c = Self::grpc_client(settings, Some(facade.store.clone()), facade.addr);
        c._facade = Some(facade);
        c
    }

    fn grpc_client(
        settings: Settings,
        store: Option<Arc<connector::store::Store>>,
        facade: SocketAddr,
    ) -> TestConnector {
        let addr = facade.to_string();
        let dir = tempfile::tempdir().expect("temp dir");
        let metrics = Arc::new(connector::metrics::Metrics::new());
        let m = metrics.clone();
        let server = ServerThread::spawn(
            testkit::ANY_LOOPBACK_PORT,
            move |listener, stop| async move {
                // The options the connector's main takes from the same settings.
                let options = connector::backend::grpc::GrpcOptions::from_settings(&settings);
                let backend =
                    connector::backend::grpc::KubemqGrpc::connect(&addr, options).expect("client");
                Self::run(settings, backend, m, listener, stop).await;
            },
        );
        TestConnector {
            addr: server.addr,
            store,
            metrics,
            server,
            _dir: dir,
            _facade: None,
            kubemq: None,
            kind: Backend::Grpc,
        }
    }

    fn serve<B: connector::backend::Backend>(
        settings: Settings,
        backend: B,
        store: Arc<connector::store::Store>,
        dir: tempfile::TempDir,
        facade: Option<TestFacade>,
    ) -> TestConnector {
        let metrics = Arc::new(connector::metrics::Metrics::new());
        let m = metrics.clone();
        let server = ServerThread::spawn(testkit::ANY_LOOPBACK_PORT, move |listener, stop| {
            Self::run(settings, backend, m, listener, stop)
        });
        TestConnector {
            addr: server.addr,
            store: Some(store),
            metrics,
            server,
            _dir: dir,
            _facade: facade,
            kubemq: None,
            kind: Backend::Embedded,
        }
    }

    async fn run<B: connector::backend::Backend>(
        settings: Settings,
        backend: B,
        metrics: Arc<connector::metrics::Metrics>,
        listener: tokio::net::TcpListener,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        // Authentication and authorization as the settings say, as the binary does.
        let security = connector::auth::Security::load(&settings)
            .await
            .expect("the test's authentication settings load");
        let cfg = Arc::new(settings.engine_config(security.auth));
        let opts = ServeOptions {
            max_connections: settings.max_connections,
            shutdown_grace: Duration::from_secs(5),
            broker_ready: None,
        };
        let bridge = connector::bridge::Bridge::new(backend, &settings, metrics, security.access);
        // Audited, paced and listed as the binary's connections are.
        let observed = connector::observed::Observing::new(bridge, Default::default());
        serve(listener, cfg, opts, Arc::new(observed), async {
            let _ = stop.await;
        })
        .await;
    }

    /// The `amqp://` URL.
    pub fn url(&self) -> String {
        format!("amqp://{}", self.addr)
    }

    /// Shuts the connector down as SIGTERM would (every connection closed with
    /// `amqp:connection:forced`) and waits until it has stopped.
    pub fn shutdown(mut self) {
        self.server.halt();
    }
}

impl TestConnector {
    /// Waits until this connector holds no RPC entry (requests waiting for their response,
    /// delivered requests waiting for an answer) and `broker` has no request waiting: what
    /// remains once requesters and responders are done.
    pub fn no_rpc_left_with(&self, broker: &connector::store::Store) {
        testkit::eventually(
            &format!("no RPC entry left ({})", self.backend()),
            Duration::from_secs(20),
            || self.rpc_held() == 0 && broker.requests().waiting() == 0,
        );
    }

    /// What this connector holds for request/reply now: requests waiting for their response and
    /// delivered requests waiting for an answer.
    pub fn rpc_held(&self) -> i64 {
        self.metrics
            .rpc_held
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The requests counted for `pattern` (`commands` or `queries`, MET-6).
    pub fn rpc_requests(&self, pattern: &str) -> u64 {
        self.metrics
            .rpc_requests
            .get_or_create(&connector::metrics::PatternLabel {
                pattern: pattern.into(),
            })
            .get()
    }

    /// [`TestConnector::no_rpc_left_with`] the store it was started with; in front of a real
    /// KubeMQ, whose waiting requests cannot be counted, only this connector's entries.
    pub fn no_rpc_left(&self) {
        match &self.store {
            Some(store) => self.no_rpc_left_with(store),
            None => testkit::eventually(
                &format!("no RPC entry left ({})", self.backend()),
                Duration::from_secs(20),
                || self.rpc_held() == 0,
            ),
        }
    }

    /// Links counted by the links gauge, both roles.
    pub fn links_counted(&self) -> i64 {
        use connector::metrics::Role;
        self.metrics.link(Role::sender).get() + self.metrics.link(Role::receiver).get()
    }
}

impl Drop for TestConnector {
    /// Every test ends with the links gauge back at 0 once its clients are gone: a link the
    /// connector still counts after its connection ended is state left behind.
    fn drop(&mut self) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !std::thread::panicking() && self.links_counted() != 0 {
            if std::time::Instant::now() > until {
                self.halt();
                panic!(
                    "{} links still counted on the {} backend after the test's clients left",
                    self.links_counted(),
                    self.backend()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.halt();
    }
}

impl TestConnector {
    fn halt(&mut self) {
        self.server.halt();
        if let Some(store) = &self.store {
            store.close();
        }
    }
}

/// `ReceiveQueueMessages` on the KubeMQ gRPC API at `addr` (the façade or a real KubeMQ).
fn receive_queue_messages(
    addr: SocketAddr,
    request: connector::kubemq::ReceiveQueueMessagesRequest,
) -> connector::kubemq::ReceiveQueueMessagesResponse {
    runtime().block_on(async move {
        let mut client =
            connector::kubemq::kubemq_client::KubemqClient::connect(format!("http://{addr}"))
                .await
                .expect("the broker answers");
        client
            .receive_queue_messages(request)
            .await
            .expect("the receive is answered")
            .into_inner()
    })
}

/// Runs a client script (`program args...` in `dir`) against the server at `addr` and asserts it
/// exits 0 and prints `PASS <scenario>`. `args` may contain `{url}` and `{port}`.
pub fn run_client_script(
    program: &str,
    dir: &str,
    args: &[&str],
    scenario: &str,
    addr: SocketAddr,
) {
    let port = addr.port().to_string();
    let url = format!("amqp://{addr}");
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{url}", &url).replace("{port}", &port))
        .collect();
    let out = std::process::Command::new(program)
        .current_dir(dir)
        .args(&args)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} must be installed (tests/run.sh installs the clients): {e}")
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {scenario} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(&format!("PASS {scenario}")), "{stdout}");
}

/// Runs a client script scenario (see [`run_client_script`]) against a connector on each backend.
pub fn run_client_script_on_both_backends(program: &str, dir: &str, args: &[&str], scenario: &str) {
    TestConnector::each_backend(Settings::default(), |c| {
        run_client_script(program, dir, args, scenario, c.addr);
    });
}

/// A requester's reply node (RPC-1): a receiver with a dynamic source on `session`, granting
/// `credit` at a time, and the address the connector minted for it.
pub async fn reply_node(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    credit: u32,
) -> (fe2o3_amqp::Receiver, String) {
    use fe2o3_amqp::link::receiver::CreditMode;
    use fe2o3_amqp::types::messaging::Source;
    let node = fe2o3_amqp::Receiver::builder()
        .name("replies")
        .source(Source::builder().dynamic(true).build())
        .credit_mode(CreditMode::Auto(credit))
        .attach(session)
        .await
        .expect("the reply node attaches");
    let address = node
        .source()
        .as_ref()
        .and_then(|s| s.address.clone())
        .expect("RPC-1: the minted address");
    assert!(address.starts_with("_amqp10.tmp."), "ADDR-11: {address}");
    (node, address)
}

/// A receiver named `name` on `source`, granting `credit` at a time, with the string-valued
/// `properties` in its ATTACH (`x-opt-kubemq-group`, `x-opt-kubemq-start`).
pub async fn receiver(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    name: &str,
    source: impl Into<fe2o3_amqp::types::messaging::Source>,
    credit: u32,
    properties: &[(&str, &str)],
) -> fe2o3_amqp::Receiver {
    use fe2o3_amqp::link::receiver::CreditMode;
    use fe2o3_amqp::types::primitives::{Symbol, Value};
    let mut builder = fe2o3_amqp::Receiver::builder()
        .name(name)
        .source(source)
        .credit_mode(CreditMode::Auto(credit));
    if !properties.is_empty() {
        let mut fields = fe2o3_amqp::types::definitions::Fields::new();
        for (k, v) in properties {
            fields.insert(Symbol::from(*k), Value::String((*v).into()));
        }
        builder = builder.properties(fields);
    }
    builder
        .attach(session)
        .await
        .expect("the receiver attaches")
}

/// A sender named `name` with a target that has no address (the anonymous relay, ADDR-13): each
/// message goes where its `to` says.
pub async fn relay_sender(
    session: &mut fe2o3_amqp::session::SessionHandle<()>,
    name: &str,
) -> fe2o3_amqp::Sender {
    fe2o3_amqp::Sender::builder()
        .name(name)
        .target(fe2o3_amqp::types::messaging::Target::builder().build())
        .attach(session)
        .await
        .expect("the relay sender attaches")
}
