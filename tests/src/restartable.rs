//! A broker that a test stops and starts again on the same port and data: the store's gRPC
//! façade (with its folder), or a real KubeMQ, killed as a crash kills it or stopped as
//! Kubernetes stops a pod.

use connector::config::Settings;

use crate::real_kubemq::{RealKubemq, StoppedKubemq};
use crate::{TestConnector, TestFacade};

/// A running broker.
pub enum Broker {
    /// The store's façade and the folder its store lives in.
    Facade(TestFacade, tempfile::TempDir),
    /// A real KubeMQ.
    Real(RealKubemq),
}

/// How a real KubeMQ goes (the façade stops one way: its server ends and every connection with
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL, as an OOM kill or a lost node.
    Crash,
    /// SIGTERM, and the server's own orderly shutdown.
    Graceful,
}

/// A broker that was stopped, to start again on the same port and data.
pub enum Stopped {
    /// The façade's port and its store's folder.
    Facade(std::net::SocketAddr, tempfile::TempDir),
    /// The real KubeMQ's port and folder.
    Real(StoppedKubemq),
}

impl Broker {
    /// The store's façade in a folder of its own.
    pub fn facade() -> Broker {
        let dir = tempfile::tempdir().expect("scratch folder");
        Broker::Facade(TestFacade::start_at(dir.path(), None), dir)
    }

    /// The store's façade imitating KubeMQ v2.4's capture of messages by open transactions
    /// ([`TestFacade::start_imitating_kubemq`]).
    pub fn imitating_kubemq() -> Broker {
        let dir = tempfile::tempdir().expect("scratch folder");
        Broker::Facade(TestFacade::start_imitating_kubemq(), dir)
    }

    /// The brokers a KubeMQ-shaped test runs on: the façade imitating KubeMQ, then a real KubeMQ
    /// where its binary exists, each started as it is reached.
    pub fn kubemq_shaped() -> impl Iterator<Item = Broker> {
        // `None` is the façade, `Some` the real KubeMQ's binary.
        std::iter::once(None)
            .chain(crate::real_kubemq::binary().map(Some))
            .map(|binary| match binary {
                None => Broker::imitating_kubemq(),
                Some(binary) => Broker::Real(RealKubemq::start(&binary)),
            })
    }

    /// Its gRPC address, for a client that sends straight to it.
    pub fn grpc(&self) -> std::net::SocketAddr {
        match self {
            Broker::Facade(f, _) => f.addr,
            Broker::Real(k) => k.grpc,
        }
    }

    /// What the broker is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Broker::Facade(..) => "the store's façade",
            Broker::Real(_) => "a real KubeMQ",
        }
    }

    /// A connector in front of it, with default settings.
    pub fn connector(&self) -> TestConnector {
        match self {
            Broker::Facade(f, _) => TestConnector::start_over_facade(Settings::default(), f),
            Broker::Real(k) => TestConnector::start_over_kubemq(Settings::default(), k),
        }
    }

    /// Stops it; what it stored stays for [`Stopped::start_again`].
    pub fn stop(self, how: Stop) -> Stopped {
        match self {
            Broker::Facade(f, dir) => {
                let addr = f.addr;
                f.stop();
                Stopped::Facade(addr, dir)
            }
            Broker::Real(k) if how == Stop::Crash => Stopped::Real(k.kill()),
            Broker::Real(k) => Stopped::Real(k.stop()),
        }
    }
}

impl Stopped {
    /// Starts the broker again on the same port and data.
    pub fn start_again(self) -> Broker {
        match self {
            Stopped::Facade(addr, dir) => {
                Broker::Facade(TestFacade::start_at(dir.path(), Some(addr)), dir)
            }
            Stopped::Real(k) => Broker::Real(k.start_again()),
        }
    }
}
