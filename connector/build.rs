//! Generates the KubeMQ gRPC types and service stubs from proto/kubemq.proto with the protoc
//! binary vendored in a crate, so a fresh machine needs neither a network nor a system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    println!("cargo:rerun-if-changed=../proto/kubemq.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Bodies are shared, not copied, from the received buffer to the AMQP frame.
        .bytes(".kubemq.QueueMessage.Body")
        .bytes(".kubemq.Event.Body")
        .bytes(".kubemq.EventReceive.Body")
        .compile_with_config(config, &["../proto/kubemq.proto"], &["../proto"])?;
    Ok(())
}
