//! Generates the KubeMQ gRPC types and service stubs from proto/kubemq.proto with the protoc
//! binary vendored in a crate, so a fresh machine needs neither a network nor a system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts run single-threaded before the crate compiles; nothing else reads PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=../proto/kubemq.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Bodies are shared, not copied, from the received buffer to the AMQP frame.
        .bytes(".kubemq.QueueMessage.Body")
        .compile_protos(&["../proto/kubemq.proto"], &["../proto"])?;
    Ok(())
}
