//! Support for the interop tests: a **test-only in-memory node** and a helper that runs the real
//! connector driver on a loopback port with it.
//!
//! The in-memory node is NOT the queues pattern and not a broker: it exists only so that real
//! AMQP clients can attach, send, receive with credit, drain and settle against the engine and
//! driver before the queues bridge and the KubeMQ backend exist (issues 3 and 4). Every address
//! names a FIFO of messages; released or modified messages go back to its front; unsettled
//! messages of a closed link are returned.

pub mod raw;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use connector::config::Settings;
use connector::driver::{serve, Handler, HandlerFactory, ServeOptions};
use connector::engine::{Connection, DeliveryOutcome, EngineConfig, Event, LinkAccept, LinkId};
use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
use tokio::sync::mpsc;

/// The shared state of every connection's handler: messages per address and who to wake.
#[derive(Default)]
pub struct MemoryNode {
    inner: Mutex<Nodes>,
}

#[derive(Default)]
struct Nodes {
    queues: HashMap<String, VecDeque<Bytes>>,
    waiters: Vec<mpsc::UnboundedSender<()>>,
}

impl MemoryNode {
    fn push(&self, address: &str, msg: Bytes, front: bool) {
        let mut n = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let q = n.queues.entry(address.to_string()).or_default();
        if front {
            q.push_front(msg);
        } else {
            q.push_back(msg);
        }
        n.waiters.retain(|w| w.send(()).is_ok());
    }

    fn pop(&self, address: &str) -> Option<Bytes> {
        let mut n = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        n.queues.get_mut(address)?.pop_front()
    }

    /// Messages waiting at `address`.
    pub fn depth(&self, address: &str) -> usize {
        let n = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        n.queues.get(address).map_or(0, |q| q.len())
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<()> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiters
            .push(tx);
        rx
    }
}

struct LinkInfo {
    address: String,
    server_sends: bool,
    presettled: bool,
    drain: bool,
}

/// One connection's handler on the memory node.
pub struct NodeHandler {
    node: Arc<MemoryNode>,
    credit_window: u32,
    links: HashMap<LinkId, LinkInfo>,
    in_flight: HashMap<u64, (String, Bytes)>,
    next_token: u64,
    wake: mpsc::UnboundedReceiver<()>,
}

impl NodeHandler {
    fn pump(&mut self, conn: &mut Connection, link: LinkId) {
        let Some(info) = self.links.get(&link) else {
            return;
        };
        if !info.server_sends {
            return;
        }
        while conn.credit(link) > 0 {
            let Some(msg) = self.node.pop(&info.address) else {
                break;
            };
            self.next_token += 1;
            let token = self.next_token;
            let tag = token.to_be_bytes();
            match conn.send(link, &tag, &msg, info.presettled, token) {
                Ok(_) => {
                    if !info.presettled {
                        self.in_flight.insert(token, (info.address.clone(), msg));
                    }
                }
                Err(_) => {
                    self.node.push(&info.address, msg, true);
                    break;
                }
            }
        }
        if info.drain {
            let _ = conn.drain_done(link);
            if let Some(i) = self.links.get_mut(&link) {
                i.drain = false;
            }
        }
    }

    fn requeue(&mut self, token: u64) {
        if let Some((addr, msg)) = self.in_flight.remove(&token) {
            self.node.push(&addr, msg, true);
        }
    }
}

impl Handler for NodeHandler {
    fn on_event(&mut self, conn: &mut Connection, event: Event) {
        match event {
            Event::AttachRequested { link, attach } => {
                let server_sends = attach.role == Role::Receiver;
                let address = if server_sends {
                    attach.source.as_ref().and_then(|s| s.address.clone())
                } else {
                    attach.target.as_ref().and_then(|t| match t.as_ref() {
                        fe2o3_amqp_types::messaging::TargetArchetype::Target(t) => {
                            t.address.clone()
                        }
                    })
                };
                self.links.insert(
                    link,
                    LinkInfo {
                        address: address.unwrap_or_default(),
                        server_sends,
                        presettled: attach.snd_settle_mode == SenderSettleMode::Settled,
                        drain: false,
                    },
                );
                let _ = conn.accept_link(
                    link,
                    LinkAccept {
                        credit_window: self.credit_window,
                    },
                );
            }
            Event::Delivery(d) => {
                if let Some(info) = self.links.get(&d.link) {
                    self.node.push(&info.address, d.payload.clone(), false);
                }
                let _ = conn.settle(d.link, d.delivery_id, DeliveryState::Accepted(Accepted {}));
            }
            Event::Credit { link, drain, .. } => {
                if let Some(i) = self.links.get_mut(&link) {
                    i.drain = drain;
                }
                self.pump(conn, link);
            }
            Event::Settled { token, state, .. } => match state {
                Some(DeliveryOutcome::Released) | Some(DeliveryOutcome::Modified { .. }) => {
                    self.requeue(token)
                }
                _ => {
                    self.in_flight.remove(&token);
                }
            },
            Event::LinkClosed {
                link, unsettled, ..
            } => {
                for t in unsettled {
                    self.requeue(t);
                }
                self.links.remove(&link);
            }
            // The node pumps on credit alone; frames past a shut window wait in the engine.
            Event::Opened { .. } | Event::Closed { .. } | Event::WindowOpened => {}
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut woke = false;
        while let Poll::Ready(Some(())) = self.wake.poll_recv(cx) {
            woke = true;
        }
        if woke {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn on_ready(&mut self, conn: &mut Connection) {
        let ids: Vec<LinkId> = self.links.keys().copied().collect();
        for id in ids {
            self.pump(conn, id);
        }
    }
}

/// Makes a [`NodeHandler`] per connection.
pub struct NodeFactory {
    /// The shared node.
    pub node: Arc<MemoryNode>,
    /// Credit window of produce links.
    pub credit_window: u32,
}

impl HandlerFactory for NodeFactory {
    type Handler = NodeHandler;
    fn new_handler(&self, _peer: SocketAddr) -> NodeHandler {
        NodeHandler {
            node: self.node.clone(),
            credit_window: self.credit_window,
            links: HashMap::new(),
            in_flight: HashMap::new(),
            next_token: 0,
            wake: self.node.subscribe(),
        }
    }
}

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

/// Loopback with an ephemeral port.
fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
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
    /// v2.4's do (`Facade::imitating_kubemq`): a stand-in for the real broker, whose Go module
    /// this project's machines cannot download.
    pub fn start_imitating_kubemq() -> TestFacade {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut f = Self::serve_at(dir.path(), None, true);
        f._dir = Some(dir);
        f
    }

    fn serve_at(dir: &std::path::Path, addr: Option<SocketAddr>, capture: bool) -> TestFacade {
        use connector::kubemq::server::{serve_facade, Facade};
        let (store, _) = connector::store::Store::open(dir).expect("store opens");
        let served = store.clone();
        let server = ServerThread::spawn(
            addr.unwrap_or_else(any_port),
            move |listener, stop| async move {
                served.start_delay_releaser();
                let facade = if capture {
                    Facade::imitating_kubemq(served)
                } else {
                    Facade::new(served)
                };
                tokio::select! {
                    _ = serve_facade(facade, listener, std::future::pending()) => {}
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
    /// The store behind it, to inspect.
    pub store: Arc<connector::store::Store>,
    /// Its metrics, to inspect.
    pub metrics: Arc<connector::metrics::Metrics>,
    server: ServerThread,
    _dir: tempfile::TempDir,
    _facade: Option<TestFacade>,
    kind: Backend,
}

/// The backends a [`TestConnector`] can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Embedded,
    Grpc,
    KubemqLike,
}

impl TestConnector {
    /// The gRPC façade of the store behind a connector started with `start_over_grpc`.
    pub fn facade_addr(&self) -> Option<SocketAddr> {
        self._facade.as_ref().map(|f| f.addr)
    }

    /// Runs `body` against a connector with `settings` on each backend in turn: the embedded
    /// store, gRPC to the store's façade, and gRPC to the façade imitating KubeMQ v2.4's capture
    /// of messages by open transactions; a failure says which backend it was on.
    pub fn each_backend(settings: Settings, body: impl Fn(&TestConnector)) {
        for backend in [Backend::Embedded, Backend::Grpc, Backend::KubemqLike] {
            let c = match backend {
                Backend::Embedded => Self::start(settings.clone()),
                Backend::Grpc => Self::start_over_grpc(settings.clone()),
                Backend::KubemqLike => Self::start_over_kubemq_like(settings.clone()),
            };
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&c)));
            if let Err(panic) = run {
                eprintln!("failed on the {} backend", c.backend());
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// Which backend this connector uses: `embedded`, `grpc` or `kubemq-like`.
    pub fn backend(&self) -> &'static str {
        match self.kind {
            Backend::Embedded => "embedded",
            Backend::Grpc => "grpc",
            Backend::KubemqLike => "kubemq-like",
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

    fn over_grpc(settings: Settings, facade: TestFacade) -> TestConnector {
        let store = facade.store.clone();
        let addr = facade.addr.to_string();
        let dir = tempfile::tempdir().expect("temp dir");
        let metrics = Arc::new(connector::metrics::Metrics::new());
        let m = metrics.clone();
        let server = ServerThread::spawn(any_port(), move |listener, stop| async move {
            let backend = connector::backend::grpc::KubemqGrpc::connect(&addr, Default::default())
                .expect("client");
            Self::run(settings, backend, m, listener, stop).await;
        });
        TestConnector {
            addr: server.addr,
            store,
            metrics,
            server,
            _dir: dir,
            _facade: Some(facade),
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
        let server = ServerThread::spawn(any_port(), move |listener, stop| {
            Self::run(settings, backend, m, listener, stop)
        });
        TestConnector {
            addr: server.addr,
            store,
            metrics,
            server,
            _dir: dir,
            _facade: facade,
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
        let cfg = Arc::new(settings.engine_config_no_auth());
        let opts = ServeOptions {
            max_connections: settings.max_connections,
            shutdown_grace: Duration::from_secs(5),
            broker_ready: None,
            count_after_header: settings.count_connections_after_header,
        };
        let bridge = connector::bridge::queues::Queues::new(backend, &settings, metrics);
        serve(listener, cfg, opts, Arc::new(bridge), async {
            let _ = stop.await;
        })
        .await;
    }

    /// The `amqp://` URL.
    pub fn url(&self) -> String {
        format!("amqp://{}", self.addr)
    }
}

impl TestConnector {
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
                self.server.halt();
                self.store.close();
                panic!(
                    "{} links still counted on the {} backend after the test's clients left",
                    self.links_counted(),
                    self.backend()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.server.halt();
        self.store.close();
    }
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

/// A connector with the memory node, serving on a loopback port in its own runtime thread.
pub struct TestServer {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The node, to inspect.
    pub node: Arc<MemoryNode>,
    server: ServerThread,
}

impl TestServer {
    /// Starts a server with these settings (port is ignored: an ephemeral port is used).
    pub fn start(settings: Settings) -> TestServer {
        let cfg: EngineConfig = settings.engine_config_no_auth();
        Self::start_with(
            cfg,
            settings.max_connections,
            settings.produce_credit_window(),
        )
    }

    /// Starts a server with an explicit engine configuration.
    pub fn start_with(cfg: EngineConfig, max_connections: u32, credit_window: u32) -> TestServer {
        let node = Arc::new(MemoryNode::default());
        let factory = Arc::new(NodeFactory {
            node: node.clone(),
            credit_window,
        });
        let server = ServerThread::spawn(any_port(), move |listener, stop| async move {
            let opts = ServeOptions {
                max_connections,
                shutdown_grace: Duration::from_secs(5),
                broker_ready: None,
                count_after_header: false,
            };
            serve(listener, Arc::new(cfg), opts, factory, async {
                let _ = stop.await;
            })
            .await;
        });
        TestServer {
            addr: server.addr,
            node,
            server,
        }
    }

    /// Starts a server with default settings.
    pub fn start_default() -> TestServer {
        Self::start(Settings::default())
    }

    /// Signals shutdown and waits for the server to finish (CLOSE forced, bounded wait).
    pub fn shutdown(mut self) {
        self.server.halt();
    }

    /// The `amqp://` URL of the server.
    pub fn url(&self) -> String {
        format!("amqp://{}", self.addr)
    }
}
