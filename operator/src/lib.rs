//! The Kubernetes operator for the connector.
//!
//! Nothing is here yet: the `AmqpConnector` CRD, its controller and the Helm chart are the work of
//! issue 5 ("Operator, AmqpConnector CRD, Helm chart and the kubectl experience"). This crate
//! exists so that the workspace has the shape that work will fill; it exports nothing and claims
//! to do nothing.
