# syntax=docker/dockerfile:1
# The connector and operator images, one target each:
#   docker build --target connector -t ghcr.io/kubemq-io/kubemq-amqp-connector:0.1.0 .
#   docker build --target operator  -t ghcr.io/kubemq-io/kubemq-amqp-operator:0.1.0 .
# images/build.sh makes the same images without a Docker daemon; it reads the final stages below
# (LABEL, WORKDIR, VOLUME, USER, EXPOSE, ENTRYPOINT), so edit them here only.

ARG RUST_VERSION=1.95

# Dependencies are compiled from a recipe (cargo-chef) in their own layer: a change to the
# project's code rebuilds only the project's crates.
FROM rust:${RUST_VERSION}-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78 \
 && cargo install cargo-auditable --locked --version 0.7.7
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json \
      -p kubemq-amqp-connector -p kubemq-amqp-operator
COPY . .
# /out/bin: the binaries without their debug info (the release profile keeps it for profiling;
# symbols stay, so backtraces name functions), each carrying the list of its crates and their
# versions (cargo-auditable), which vulnerability scanners read. /out/data: an empty folder for
# the store's volume.
RUN cargo auditable build --release --locked \
      -p kubemq-amqp-connector --bin kubemq-amqp-connector \
      -p kubemq-amqp-operator --bin kubemq-amqp-operator \
 && mkdir -p /out/bin /out/data \
 && for b in kubemq-amqp-connector kubemq-amqp-operator; do \
      objcopy --strip-debug "target/release/$b" "/out/bin/$b"; \
    done

# Final images: distroless (glibc, CA certificates, /etc/passwd with the nonroot user 65532,
# nsswitch.conf; no shell, no package manager), the binary and nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot AS connector
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kubemq-amqp-connector" \
      org.opencontainers.image.description="AMQP 1.0 connector for the KubeMQ message broker" \
      org.opencontainers.image.source="https://github.com/kubemq-io/kubemq-amqp-connector" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/bin/kubemq-amqp-connector /usr/local/bin/kubemq-amqp-connector
# The embedded store's DataDir ("data", relative) lands on this volume: the root filesystem can
# stay read-only.
COPY --from=builder --chown=65532:65532 /out/data /var/lib/kubemq-amqp
WORKDIR /var/lib/kubemq-amqp
VOLUME /var/lib/kubemq-amqp
USER 65532:65532
EXPOSE 5672/tcp 5671/tcp 9090/tcp
ENTRYPOINT ["/usr/local/bin/kubemq-amqp-connector"]

FROM gcr.io/distroless/cc-debian12:nonroot AS operator
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kubemq-amqp-operator" \
      org.opencontainers.image.description="Kubernetes operator for the KubeMQ AMQP 1.0 connector" \
      org.opencontainers.image.source="https://github.com/kubemq-io/kubemq-amqp-connector" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/bin/kubemq-amqp-operator /usr/local/bin/kubemq-amqp-operator
USER 65532:65532
EXPOSE 8080/tcp
ENTRYPOINT ["/usr/local/bin/kubemq-amqp-operator"]
