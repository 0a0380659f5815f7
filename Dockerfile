# bladbase-ratelimit: multi-stage build for Cloud Run.
#
# Build stage: the same toolchain as CI (Rust 1.95). The build command below is the one
# `.ci/run` runs too (`scripts/release-build`: a profile-guided build, trained by a few
# seconds of h2load against an instrumented binary on loopback), so a green CI means
# this step builds. No protoc is needed: build.rs uses protox. The optimisation settings
# (thin LTO, codegen-units 1) live in Cargo.toml's [profile.release].
FROM rust:1.95-bookworm AS build
RUN rustup component add llvm-tools \
 && apt-get update \
 && apt-get install -y --no-install-recommends nghttp2-client xxd \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/release-build \
 && strip target/release/ratelimit

# Runtime: distroless cc (glibc, libgcc, ca-certificates for TLS to RTDB and Google),
# as the built-in non-root user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/ratelimit /usr/local/bin/ratelimit
USER nonroot:nonroot
# Cloud Run sets PORT; the service listens on 0.0.0.0:$PORT (50051 when unset).
EXPOSE 50051
CMD ["ratelimit", "serve"]
