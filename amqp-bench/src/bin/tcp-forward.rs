//! tcp-forward: a byte-for-byte TCP forwarder, the cheapest possible "connector". overhead.sh
//! runs the direct gRPC load through it to measure what any extra process hop costs on the
//! machine, apart from what the connector does (AMQP, the envelope, its own gRPC client).
//!
//! Usage: `tcp-forward LISTEN_ADDR TARGET_ADDR`, e.g. `tcp-forward 127.0.0.1:50001 127.0.0.1:50000`;
//! it prints `listening on ADDR` once bound (port 0 picks a free one).

use tokio::net::{TcpListener, TcpStream};

/// Bytes each direction moves per read: a 100-message batch of 1 KiB bodies passes in one read.
const BUFFER: usize = 256 * 1024;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(target)) = (args.next(), args.next()) else {
        eprintln!("usage: tcp-forward LISTEN_ADDR TARGET_ADDR");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (mut inbound, _) = listener.accept().await?;
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(&target).await else {
                eprintln!("tcp-forward: cannot reach {target}");
                return;
            };
            // Forwarding must not add Nagle delays the endpoints asked to avoid.
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional_with_sizes(
                &mut inbound,
                &mut outbound,
                BUFFER,
                BUFFER,
            )
            .await;
        });
    }
}
