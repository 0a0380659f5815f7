//! Compiles `proto/` with protox (a pure-Rust protobuf compiler) so no `protoc`
//! binary is needed on any machine, and writes the descriptor set that gRPC
//! reflection serves (with source info, so `grpcurl describe` shows comments).
use protox::prost::Message as _;
use std::{env, fs, path::PathBuf};

const PROTO: &str = "bladbase/ratelimit/v1/ratelimit.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let fds = protox::compile([PROTO], ["proto"])?;
    fs::write(
        out_dir.join("ratelimit_descriptor.bin"),
        fds.encode_to_vec(),
    )?;
    // The server side of the generated code only with the `server` feature, the client
    // stub only with `client`: a client-only build compiles the messages and the stub.
    let server = env::var_os("CARGO_FEATURE_SERVER").is_some();
    let client = env::var_os("CARGO_FEATURE_CLIENT").is_some();
    // Our codec (src/codec.rs): prost messages decoded from and encoded into slices.
    tonic_prost_build::configure()
        .codec_path("crate::codec::SliceCodec")
        .build_server(server)
        .build_client(client)
        .compile_fds(fds)?;
    // compile_fds does not emit this itself.
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
