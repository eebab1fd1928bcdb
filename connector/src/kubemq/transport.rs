//! How both ends of KubeMQ's gRPC API are tuned: the connector's client and the embedded
//! store's server use the same limits and HTTP/2 windows.

/// Largest gRPC message either way, as on KubeMQ.
pub const MAX_GRPC_MESSAGE: usize = 100 * 1024 * 1024;
/// HTTP/2 receive window per stream: a Get reply of a few hundred 1 KiB messages, or one large
/// message, arrives without waiting for WINDOW_UPDATEs (the default is 64 KiB); a QueuesUpstream
/// batch likewise.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// Largest HTTP/2 frame accepted.
pub const MAX_FRAME: u32 = 1024 * 1024;
/// HTTP/2 receive window of the whole connection, shared by its streams.
pub const CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;
