//! Prints the AmqpConnector CRD (`cargo run -p kubemq-amqp-operator --bin crdgen > crds/amqpconnector.yaml`).

fn main() {
    match kubemq_amqp_operator::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: {e}");
            std::process::exit(1);
        }
    }
}
