//! Deliveries the connector sends to clients: a part numbers each one with a token, which is
//! also its delivery tag, and the engine hands the token back when the client settles the
//! delivery (`Settled`) or its link ends with it unsettled (`LinkClosed`).

use crate::engine::{CommandError, Connection, LinkId};

/// One delivery the connector sent, as its part knows it when it comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DeliveryToken(u64);

impl DeliveryToken {
    /// The token of a delivery the engine reports back.
    pub(crate) fn reported(raw: u64) -> Self {
        DeliveryToken(raw)
    }
}

/// Numbers and sends one part's deliveries, so that tokens never repeat within the part.
#[derive(Debug)]
pub(crate) struct Outbound {
    next: u64,
}

impl Default for Outbound {
    fn default() -> Self {
        Outbound { next: 1 }
    }
}

impl Outbound {
    /// Sends `payload` as one delivery on `link`, within its credit.
    pub(crate) fn send(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        payload: &[u8],
        presettled: bool,
    ) -> Result<DeliveryToken, CommandError> {
        let token = self.next;
        self.next += 1;
        conn.send(link, &token.to_be_bytes(), payload, presettled, token)?;
        Ok(DeliveryToken(token))
    }
}
