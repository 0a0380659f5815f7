//! The gRPC codec of the generated `RateLimiter` server and client (`build.rs` names it):
//! prost messages, as `tonic_prost::ProstCodec` does, decoded from and encoded into plain
//! byte slices where it can.
//!
//! Why not `ProstCodec` itself: it decodes through tonic's `DecodeBuf` and encodes through
//! its `EncodeBuf`, each byte of a varint or tag a call through the `Buf`/`BufMut` traits
//! on a `BytesMut`. A gRPC message almost always arrives in one contiguous chunk, and a
//! `RateLimiter` answer is a few dozen bytes, so this codec decodes the chunk as a `&[u8]`
//! and encodes into a stack buffer copied in once: the same bytes on the wire, prost's
//! own slice paths, fewer instructions per call (BENCHMARKS.md §13). Anything else (a
//! message split across chunks, an answer larger than the buffer) takes `ProstCodec`'s
//! path unchanged.
//!
//! One thing it does differently: a message that does not decode is blamed on whoever
//! sent it ([`Decoded`]). `ProstCodec` answers `INTERNAL` either way, so a caller whose
//! key is not UTF-8 was told the server had failed, and clients retry an `INTERNAL`.

use crate::pb;
use prost::Message;
use prost::bytes::{Buf, BufMut};
use std::marker::PhantomData;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// Answers up to this size are encoded on the stack; larger ones straight into tonic's
/// buffer. Every `RateLimiter` answer with a limit name of up to 64 bytes fits.
const STACK_ENCODE: usize = 256;

/// A [`Codec`] for prost messages `T` (sent) and `U` (received).
#[derive(Debug, Clone, Copy)]
pub struct SliceCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// A message this codec receives, and the status when its bytes do not decode: the
/// sender's fault. A request the server cannot decode (a key or limit that is not UTF-8,
/// a field of the wrong wire type, a truncated message) is the caller's bad input,
/// `INVALID_ARGUMENT` as for any other rule a field breaks; an answer the client cannot
/// decode is the server's fault, `INTERNAL`.
pub trait Decoded: Message + Default {
    /// The code of the status a message that does not decode gets.
    const UNDECODABLE: Code;
}

macro_rules! decoded {
    ($code:ident: $($message:ty),+) => {
        $(impl Decoded for $message {
            const UNDECODABLE: Code = Code::$code;
        })+
    };
}

decoded!(InvalidArgument: pb::CheckRequest, pb::PeekRequest, pb::ResetRequest, pb::ListLimitsRequest);
decoded!(Internal: pb::CheckResponse, pb::ResetResponse, pb::ListLimitsResponse);
// The benchmarks' Health/Check client (benches/loadgen/ceiling.rs) uses this codec too.
#[cfg(feature = "server")]
decoded!(Internal: tonic_health::pb::HealthCheckResponse);

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Decoded + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SliceEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SliceEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Encodes `T` (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct SliceEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SliceEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let mut stack = [0u8; STACK_ENCODE];
        let mut free: &mut [u8] = &mut stack;
        let encoded = match item.encode(&mut free) {
            Ok(()) => STACK_ENCODE - free.len(),
            // Too large for the stack: prost wrote nothing, so encode it in place.
            Err(_) => return item.encode(buf).map_err(internal),
        };
        buf.put_slice(stack.get(..encoded).unwrap_or_default());
        Ok(())
    }
}

/// Decodes `U` (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Decoded> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let undecodable = |e: prost::DecodeError| Status::new(U::UNDECODABLE, e.to_string());
        let len = buf.remaining();
        let chunk = buf.chunk();
        let item = if chunk.len() == len {
            let item = U::decode(chunk).map_err(undecodable)?;
            buf.advance(len);
            item
        } else {
            U::decode(buf).map_err(undecodable)?
        };
        Ok(Some(item))
    }
}

/// The status `ProstCodec` gives a message that does not encode: ours to fix.
fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{CheckRequest, CheckResponse};

    #[test]
    fn encodes_the_bytes_prost_does_on_the_stack_and_past_it() {
        for name in ["mcp".to_owned(), "n".repeat(STACK_ENCODE * 2)] {
            let answer = CheckResponse {
                allowed: true,
                limit: 120,
                remaining: 7,
                limit_name: name,
                ..Default::default()
            };
            let mut stack = [0u8; STACK_ENCODE];
            let mut free: &mut [u8] = &mut stack;
            let fits = answer.encode(&mut free).is_ok();
            assert_eq!(fits, answer.encoded_len() <= STACK_ENCODE);
            if fits {
                let used = STACK_ENCODE - free.len();
                assert_eq!(stack.get(..used), Some(answer.encode_to_vec().as_slice()));
            } else {
                assert_eq!(free.len(), STACK_ENCODE, "a failed encode writes nothing");
            }
        }
    }

    #[test]
    fn decodes_what_prost_encodes_and_rejects_what_it_rejects() {
        let request = CheckRequest {
            key: "ü~key".into(),
            limit: "mcp".into(),
            cost: 3,
        };
        let bytes = request.encode_to_vec();
        assert_eq!(CheckRequest::decode(bytes.as_slice()).ok(), Some(request));
        // A key that is not UTF-8 is refused, as ProstCodec refuses it.
        let bad = [0x0a, 0x02, 0xff, 0xfe];
        assert!(CheckRequest::decode(&bad[..]).is_err());
    }
}
