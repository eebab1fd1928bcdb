//! Whether a connection may open: asked once, when the client's OPEN arrives (after SASL), so a
//! client that never gets that far holds nothing its application counts as a connection.

use crate::error::AmqpError;

/// Decides, at the client's OPEN, whether the connection is admitted (CONN-15).
pub trait Admission: Send {
    /// `None` admits the connection; `Some` is the error its OPEN is refused with.
    fn at_open(&mut self) -> Option<AmqpError>;
}

/// Admits every connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct AdmitAll;

impl Admission for AdmitAll {
    fn at_open(&mut self) -> Option<AmqpError> {
        None
    }
}

/// A decision made before the connection started: `Some` refuses it.
impl Admission for Option<AmqpError> {
    fn at_open(&mut self) -> Option<AmqpError> {
        self.take()
    }
}

impl<A: Admission + ?Sized> Admission for Box<A> {
    fn at_open(&mut self) -> Option<AmqpError> {
        (**self).at_open()
    }
}
