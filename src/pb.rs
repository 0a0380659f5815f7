//! The generated protobuf and gRPC code for `bladbase.ratelimit.v1` (see `proto/`), and
//! the encoded descriptor set that gRPC reflection serves.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("bladbase.ratelimit.v1");

/// The descriptor set of `ratelimit.proto`, with its imports and comments, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ratelimit_descriptor");
