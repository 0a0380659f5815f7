//! Turning any caller key into one valid RTDB key, reversibly.
//!
//! Caller keys are e-mails, IPs, token ids: anything up to 512 bytes of UTF-8. RTDB keys
//! must not contain `. $ # [ ] /` or ASCII control characters and are at most 768
//! bytes. Two encodings, chosen per key:
//!
//! - **escaped** (readable in the console): every forbidden byte, and `%` and `:`
//!   themselves, become `%XX` (uppercase hex); everything else, including non-ASCII
//!   UTF-8, stays as is. `alice@example.com` → `alice@example%2Ecom`.
//! - **base64** when escaping would exceed 768 bytes (at most 3× growth on 512 bytes):
//!   `%b` + base64url without padding, at most 2 + 683 bytes.
//!
//! Distinct keys never collide: escaped output only ever has `%` followed by two
//! uppercase hex digits, so it can never start with `%b`, and within each scheme the
//! mapping is injective. [`decode`] inverts [`encode`].

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// RTDB's key length limit, in bytes.
pub const MAX_RTDB_KEY_BYTES: usize = 768;
const BASE64_PREFIX: &str = "%b";

fn must_escape(b: u8) -> bool {
    matches!(b, b'.' | b'$' | b'#' | b'[' | b']' | b'/' | b'%' | b':') || b < 0x20 || b == 0x7f
}

/// Encodes `key` as a valid RTDB key.
pub fn encode(key: &str) -> String {
    let escapes = key.bytes().filter(|&b| must_escape(b)).count();
    if key.len() + 2 * escapes > MAX_RTDB_KEY_BYTES {
        return format!("{BASE64_PREFIX}{}", URL_SAFE_NO_PAD.encode(key.as_bytes()));
    }
    let mut out = String::with_capacity(key.len() + 2 * escapes);
    for c in key.chars() {
        // Only ASCII bytes are ever escaped; multi-byte UTF-8 passes through whole.
        match u8::try_from(c) {
            Ok(b) if must_escape(b) => {
                out.push('%');
                out.push(hex_digit(b >> 4));
                out.push(hex_digit(b & 0xf));
            }
            _ => out.push(c),
        }
    }
    out
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

/// Decodes an RTDB key produced by [`encode`]; `None` if it is not one.
pub fn decode(encoded: &str) -> Option<String> {
    if let Some(b64) = encoded.strip_prefix(BASE64_PREFIX) {
        let bytes = URL_SAFE_NO_PAD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok();
    }
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            let b = hi << 4 | lo;
            if !must_escape(b) {
                return None; // never produced by encode: keeps decoding one-to-one
            }
            out.push(b);
            i += 3;
        } else {
            if must_escape(bytes[i]) {
                return None;
            }
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// True when `s` is a valid RTDB key (length and character rules).
pub fn is_valid_rtdb_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_RTDB_KEY_BYTES
        && !s
            .bytes()
            .any(|b| matches!(b, b'.' | b'$' | b'#' | b'[' | b']' | b'/') || b < 0x20 || b == 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn readable_keys_stay_readable() {
        assert_eq!(encode("alice@example.com"), "alice@example%2Ecom");
        assert_eq!(encode("10.0.0.1"), "10%2E0%2E0%2E1");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode("../x"), "%2E%2E%2Fx");
        assert_eq!(encode("$#[]"), "%24%23%5B%5D");
        assert_eq!(encode("%2F"), "%252F");
        assert_eq!(encode("tok_AZaz09-"), "tok_AZaz09-");
        assert_eq!(encode("ключ"), "ключ");
    }

    #[test]
    fn long_escaped_keys_switch_to_base64_within_768_bytes() {
        let k = "/".repeat(512);
        let e = encode(&k);
        assert!(
            e.starts_with("%b") && e.len() <= MAX_RTDB_KEY_BYTES,
            "{}",
            e.len()
        );
        assert_eq!(decode(&e).as_deref(), Some(k.as_str()));
    }

    #[test]
    fn decode_refuses_what_encode_never_produces() {
        for bad in ["%2", "%zz", "%41", "a.b", "%2e"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn encoding_is_valid_and_reversible(key in "\\PC{1,200}|[./$#\\[\\]%:\\x00-\\x1f\\x7f]{1,512}") {
            prop_assume!(key.len() <= 512);
            let e = encode(&key);
            prop_assert!(is_valid_rtdb_key(&e), "invalid: {e:?}");
            prop_assert_eq!(decode(&e), Some(key));
        }

        #[test]
        fn any_string_up_to_512_bytes_encodes_validly(key in any::<String>()) {
            prop_assume!(!key.is_empty() && key.len() <= 512);
            let e = encode(&key);
            prop_assert!(is_valid_rtdb_key(&e));
            prop_assert_eq!(decode(&e), Some(key));
        }

        #[test]
        fn distinct_keys_never_collide(a in any::<String>(), b in any::<String>()) {
            prop_assume!(a != b && !a.is_empty() && !b.is_empty() && a.len() <= 512 && b.len() <= 512);
            prop_assert_ne!(encode(&a), encode(&b));
        }
    }
}
