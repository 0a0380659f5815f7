//! Turning any caller key into one RTDB key that fits the path budget and travels in a
//! URL path as it is.
//!
//! Caller keys are e-mails, IPs, token ids: anything up to 512 bytes of UTF-8. RTDB
//! forbids `. $ # [ ] /` and control characters in keys and bounds a **whole path** at
//! 768 bytes (reference/rtdb-rest.md, Limits); a URL path must not carry `%`, `+`, `?`
//! or non-ASCII bytes raw. So an encoded key uses only `[A-Za-z0-9_-]` and the escape
//! character `~`, which RFC 3986 calls unreserved (no URL library percent-encodes it)
//! and RTDB allows in keys. Three forms, chosen per key, the first that fits
//! [`MAX_ENCODED_KEY_BYTES`]:
//!
//! - **escaped** (readable in the console): `A-Z a-z 0-9 _ -` stay as they are, every
//!   other byte becomes `~XX` (two uppercase hex digits). `alice@example.com` →
//!   `alice~40example~2Ecom`.
//! - **base64**: `~b` + base64url without padding (its alphabet is `[A-Za-z0-9_-]`), for
//!   keys up to 460 bytes that escape too long.
//! - **hashed**: `~h` + base64url of the key's SHA-256 (45 bytes), for longer ones. Not
//!   reversible; SHA-256 keeps distinct keys on distinct nodes.
//!
//! The forms never collide: escaped output has `~` only before two uppercase hex digits,
//! never before `b` or `h`, and within each form the mapping is injective (escaping and
//! base64 are reversible, and the form is a function of the key). [`decode`] inverts
//! [`encode`] for the first two forms and accepts only what [`encode`] produces.
//!
//! The budget is fixed, not per limit, so a key's node name depends on the key alone:
//! `/{root}/{limit}/{key}/{window}` with the longest root ([`MAX_ROOT_BYTES`], checked by
//! `target.rs`), limit name ([`MAX_NAME_LEN`], checked by `limits.rs`) and window child
//! ([`MAX_WINDOW_CHILD_BYTES`]) is at most [`MAX_PATH_BYTES`].

use crate::limits::MAX_NAME_LEN;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// RTDB's bound on a whole path, and on one key, in bytes of UTF-8.
pub const MAX_PATH_BYTES: usize = 768;
/// Longest accepted root path (`--rtdb-root`), its inner `/` included.
pub const MAX_ROOT_BYTES: usize = 64;
/// Longest window child: an `i64` in decimal, sign included.
pub const MAX_WINDOW_CHILD_BYTES: usize = 20;
/// Longest encoded key: what the path leaves, with a `/` before each of its four parts.
pub const MAX_ENCODED_KEY_BYTES: usize =
    MAX_PATH_BYTES - (1 + MAX_ROOT_BYTES) - (1 + MAX_NAME_LEN) - 1 - (1 + MAX_WINDOW_CHILD_BYTES);

const ESCAPE: u8 = b'~';
const BASE64_PREFIX: &str = "~b";
const HASH_PREFIX: &str = "~h";

/// True for the bytes that pass unescaped: safe in RTDB keys and in URL paths.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Encodes `key` as an RTDB key of at most [`MAX_ENCODED_KEY_BYTES`] bytes of
/// `[A-Za-z0-9_~-]`.
pub fn encode(key: &str) -> String {
    let escaped_len = key
        .bytes()
        .map(|b| if is_plain(b) { 1 } else { 3 })
        .sum::<usize>();
    if escaped_len <= MAX_ENCODED_KEY_BYTES {
        let mut out = String::with_capacity(escaped_len);
        for b in key.bytes() {
            if is_plain(b) {
                out.push(char::from(b));
            } else {
                out.push(char::from(ESCAPE));
                out.push(hex_digit(b >> 4));
                out.push(hex_digit(b & 0xf));
            }
        }
        return out;
    }
    if BASE64_PREFIX.len() + (key.len() * 4).div_ceil(3) <= MAX_ENCODED_KEY_BYTES {
        return format!("{BASE64_PREFIX}{}", URL_SAFE_NO_PAD.encode(key.as_bytes()));
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    format!("{HASH_PREFIX}{}", URL_SAFE_NO_PAD.encode(digest.as_ref()))
}

/// True when `encoded` is the hashed form, whose caller key cannot be recovered.
pub fn is_hashed(encoded: &str) -> bool {
    encoded.starts_with(HASH_PREFIX)
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(n & 0xf)])
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes an RTDB key produced by [`encode`]; `None` if it is not one, or is hashed.
pub fn decode(encoded: &str) -> Option<String> {
    if is_hashed(encoded) {
        return None;
    }
    let key = if let Some(b64) = encoded.strip_prefix(BASE64_PREFIX) {
        String::from_utf8(URL_SAFE_NO_PAD.decode(b64).ok()?).ok()?
    } else {
        unescape(encoded)?
    };
    // One-to-one: only the form encode itself picks for this key decodes (a base64 form
    // of a key that fits escaped, or `~41` for a plain `A`, is refused).
    (!key.is_empty() && encode(&key) == encoded).then_some(key)
}

fn unescape(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == ESCAPE {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else if is_plain(bytes[i]) {
            out.push(bytes[i]);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// True when `s` is a valid RTDB key (length and character rules).
pub fn is_valid_rtdb_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PATH_BYTES
        && !s
            .bytes()
            .any(|b| matches!(b, b'.' | b'$' | b'#' | b'[' | b']' | b'/') || b < 0x20 || b == 0x7f)
}

/// True when `s` is one path segment this service may put in a URL as it is (root
/// segments, limit names): non-empty `[A-Za-z0-9_-]`.
pub fn is_plain_segment(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_plain)
}

#[cfg(test)]
mod tests;
