# bladbase-ratelimit: multi-stage build for Cloud Run.
#
# Build stage: the same toolchain as CI (Rust 1.95). The build command below is the one
# `.ci/run` runs too (`cargo build --release --locked --bin ratelimit`), so a green CI
# means this step compiles. No protoc is needed: build.rs uses protox. The optimisation
# settings (thin LTO) live in Cargo.toml's [profile.release], so this build uses them.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin ratelimit \
 && strip target/release/ratelimit

# Runtime: distroless cc (glibc, libgcc, ca-certificates for TLS to RTDB and Google),
# as the built-in non-root user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/ratelimit /usr/local/bin/ratelimit
USER nonroot:nonroot
# Cloud Run sets PORT; the service listens on 0.0.0.0:$PORT (50051 when unset).
EXPOSE 50051
CMD ["ratelimit", "serve"]
