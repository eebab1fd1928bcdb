//! Test doubles of a backend that change one or two of its calls: a double implements
//! [`Overrides`] with the backend it wraps and the calls it changes, and [`Double`] makes it a
//! [`Backend`] whose every other call goes to the wrapped one.

use std::future::Future;

use super::queue_watch::QueueView;
use super::{Backend, BackendError, Downstream, EventStream, ReadCheck, ReadyHint, RequestStream};
use crate::engine::Credential;
use crate::kubemq::{
    Event, PingResult, QueueMessage, QueuesInfo, Request, Response, SendQueueMessageResult,
    Subscribe,
};

/// What a double changes of the backend it wraps; every call it leaves out is the wrapped one's.
pub(crate) trait Overrides: Send + Sync + Sized + 'static {
    /// The wrapped backend.
    type Inner: Backend;
    /// The double's downstream sessions (the wrapped one's, or a wrapper of them).
    type Downstream: Downstream;

    /// The wrapped backend.
    fn inner(&self) -> &Self::Inner;

    /// Opens a downstream session.
    fn open_downstream(
        &self,
    ) -> impl Future<Output = Result<Self::Downstream, BackendError>> + Send;

    /// See [`Backend::send_queue`].
    fn send_queue(
        &self,
        lane: u64,
        messages: Vec<QueueMessage>,
    ) -> impl Future<Output = Result<Vec<SendQueueMessageResult>, BackendError>> + Send {
        self.inner().send_queue(lane, messages)
    }

    /// See [`Backend::captures`].
    fn captures(&self) -> bool {
        self.inner().captures()
    }

    /// See [`Backend::ready_hint`].
    fn ready_hint(&self, channel: &str) -> ReadyHint {
        self.inner().ready_hint(channel)
    }

    /// See [`Backend::stored_hint`].
    fn stored_hint(&self, channel: &str) -> u64 {
        self.inner().stored_hint(channel)
    }

    /// See [`Backend::ready_changes`].
    fn ready_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        self.inner().ready_changes()
    }

    /// See [`Backend::watch_queue`].
    fn watch_queue(&self, channel: &str) -> Option<tokio::sync::watch::Receiver<QueueView>> {
        self.inner().watch_queue(channel)
    }

    /// See [`Backend::check_read`].
    fn check_read(
        &self,
        channel: &str,
        client_id: &str,
    ) -> impl Future<Output = Result<ReadCheck, BackendError>> + Send {
        self.inner().check_read(channel, client_id)
    }
}

/// A double as a backend.
pub(crate) struct Double<O>(pub O);

impl<O> std::ops::Deref for Double<O> {
    type Target = O;

    fn deref(&self) -> &O {
        &self.0
    }
}

impl<O: Overrides> Backend for Double<O> {
    type Downstream = O::Downstream;

    fn send_queue(
        &self,
        lane: u64,
        messages: Vec<QueueMessage>,
    ) -> impl Future<Output = Result<Vec<SendQueueMessageResult>, BackendError>> + Send {
        self.0.send_queue(lane, messages)
    }

    fn open_downstream(
        &self,
    ) -> impl Future<Output = Result<Self::Downstream, BackendError>> + Send {
        self.0.open_downstream()
    }

    fn queues_info(
        &self,
        filter: &str,
    ) -> impl Future<Output = Result<QueuesInfo, BackendError>> + Send {
        self.0.inner().queues_info(filter)
    }

    fn send_event(
        &self,
        event: Event,
    ) -> impl Future<Output = Result<String, BackendError>> + Send {
        self.0.inner().send_event(event)
    }

    fn subscribe_events(
        &self,
        request: Subscribe,
    ) -> impl Future<Output = Result<EventStream, BackendError>> + Send {
        self.0.inner().subscribe_events(request)
    }

    fn forget_cursor(
        &self,
        client_id: &str,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        self.0.inner().forget_cursor(client_id)
    }

    fn send_request(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Response, BackendError>> + Send {
        self.0.inner().send_request(request)
    }

    fn subscribe_requests(
        &self,
        request: Subscribe,
    ) -> impl Future<Output = Result<RequestStream, BackendError>> + Send {
        self.0.inner().subscribe_requests(request)
    }

    fn send_response(
        &self,
        response: Response,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        self.0.inner().send_response(response)
    }

    fn ping(&self) -> impl Future<Output = Result<PingResult, BackendError>> + Send {
        self.0.inner().ping()
    }

    fn with_credential(&self, _credential: &Credential) -> Option<Self> {
        None
    }

    fn captures(&self) -> bool {
        self.0.captures()
    }

    fn ready_hint(&self, channel: &str) -> ReadyHint {
        self.0.ready_hint(channel)
    }

    fn stored_hint(&self, channel: &str) -> u64 {
        self.0.stored_hint(channel)
    }

    fn ready_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        self.0.ready_changes()
    }

    fn watch_queue(&self, channel: &str) -> Option<tokio::sync::watch::Receiver<QueueView>> {
        self.0.watch_queue(channel)
    }

    fn check_read(
        &self,
        channel: &str,
        client_id: &str,
    ) -> impl Future<Output = Result<ReadCheck, BackendError>> + Send {
        self.0.check_read(channel, client_id)
    }
}
