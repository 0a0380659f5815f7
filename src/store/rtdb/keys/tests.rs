use super::*;
use crate::decision::MAX_KEY_BYTES;
use proptest::prelude::*;

/// The longest node path any valid key can produce: longest root, limit name and
/// window child, with this key.
fn worst_path(encoded: &str) -> String {
    let root = format!("{}/{}", "r".repeat(31), "s".repeat(MAX_ROOT_BYTES - 32));
    assert_eq!(root.len(), MAX_ROOT_BYTES);
    let limit = "l".repeat(MAX_NAME_LEN);
    format!("/{root}/{limit}/{encoded}/{}", i64::MIN)
}

/// Everything the issue asks of one key's encoding.
fn check(key: &str) -> Result<String, TestCaseError> {
    let e = encode(key);
    prop_assert!(is_valid_rtdb_key(&e), "invalid RTDB key: {e:?}");
    prop_assert!(
        e.bytes().all(|b| is_plain(b) || b == b'~'),
        "only [A-Za-z0-9_-] and ~: {e:?}"
    );
    prop_assert!(e.len() <= MAX_ENCODED_KEY_BYTES, "{} bytes", e.len());
    prop_assert!(worst_path(&e).len() <= MAX_PATH_BYTES);
    if is_hashed(&e) {
        prop_assert_eq!(decode(&e), None);
        prop_assert!(key.len() > 460, "short keys stay reversible: {}", key.len());
    } else {
        prop_assert_eq!(decode(&e), Some(key.to_owned()), "reversible");
    }
    Ok(e)
}

/// Up to 512 bytes of UTF-8 made of `chars` (cut at a character boundary).
fn up_to_512_bytes(chars: Vec<char>) -> String {
    let mut s = String::new();
    for c in chars {
        if s.len() + c.len_utf8() > MAX_KEY_BYTES {
            break;
        }
        s.push(c);
    }
    s
}

fn non_ascii_key() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::char::range('\u{80}', '\u{10FFFF}'), 1..=512)
        .prop_map(up_to_512_bytes)
}

fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>().prop_map(|s| up_to_512_bytes(s.chars().collect())),
        "[./$#\\[\\]%:+?~ \\x00-\\x1f\\x7f]{1,512}",
        "[A-Za-z0-9_@.-]{1,512}",
        non_ascii_key(),
        Just(".".repeat(512)),
        Just("ü".repeat(256)),
    ]
    .prop_filter("valid key", |k| !k.is_empty() && k.len() <= MAX_KEY_BYTES)
}

#[test]
fn the_path_budget_adds_up_to_768_bytes() {
    assert_eq!(MAX_ENCODED_KEY_BYTES, 616);
    let longest = "x".repeat(MAX_ENCODED_KEY_BYTES);
    assert_eq!(worst_path(&longest).len(), MAX_PATH_BYTES);
    assert_eq!(i64::MIN.to_string().len(), MAX_WINDOW_CHILD_BYTES);
}

#[test]
fn readable_keys_stay_readable() {
    assert_eq!(encode("alice@example.com"), "alice~40example~2Ecom");
    assert_eq!(encode("10.0.0.1"), "10~2E0~2E0~2E1");
    assert_eq!(encode("a/b"), "a~2Fb");
    assert_eq!(encode("../x"), "~2E~2E~2Fx");
    assert_eq!(encode("a+b%2F"), "a~2Bb~252F");
    assert_eq!(encode("~b"), "~7Eb");
    assert_eq!(encode("tok_AZaz09-"), "tok_AZaz09-");
    assert_eq!(encode("ключ"), "~D0~BA~D0~BB~D1~8E~D1~87");
}

#[test]
fn each_form_takes_over_exactly_where_the_previous_one_no_longer_fits() {
    let fits = "/".repeat(MAX_ENCODED_KEY_BYTES / 3); // 205 bytes → 615 escaped
    assert_eq!(encode(&fits).len(), 615);
    let too_long = "/".repeat(MAX_ENCODED_KEY_BYTES / 3 + 1);
    assert!(encode(&too_long).starts_with(BASE64_PREFIX));
    let b64 = ".".repeat(460);
    assert!(encode(&b64).starts_with(BASE64_PREFIX));
    assert_eq!(encode(&b64).len(), MAX_ENCODED_KEY_BYTES);
    let hashed = ".".repeat(461);
    assert!(is_hashed(&encode(&hashed)));
    assert_eq!(encode(&hashed).len(), 45);
    // A long plain key stays escaped (one byte per byte) all the way to 512.
    assert_eq!(encode(&"a".repeat(512)), "a".repeat(512));
}

#[test]
fn the_issues_worst_cases_fit_and_stay_distinct() {
    let dots = ".".repeat(512);
    let umlauts = "ü".repeat(256);
    let other = format!("{}ä", "ü".repeat(255));
    for k in [&dots, &umlauts, &other] {
        let e = encode(k);
        assert!(is_hashed(&e), "{k:?}");
        assert!(worst_path(&e).len() <= MAX_PATH_BYTES);
    }
    assert_ne!(encode(&umlauts), encode(&other));
}

#[test]
fn decode_refuses_what_encode_never_produces() {
    for bad in [
        // `~bYQ` is the base64 form of "a", which encode writes as `a`.
        "~2", "~zz", "~41", "~2e", "a.b", "a%2Eb", "a+b", "~b", "~bYQ", "", "~h", "é",
    ] {
        assert_eq!(decode(bad), None, "{bad}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_key_encodes_validly_within_budget_and_reversibly_unless_hashed(key in any_key()) {
        check(&key)?;
    }

    #[test]
    fn distinct_keys_never_share_a_node(a in any_key(), b in any_key()) {
        prop_assume!(a != b);
        prop_assert_ne!(check(&a)?, check(&b)?);
    }

    #[test]
    fn keys_one_byte_apart_never_share_a_node(key in any_key(), last in any::<char>()) {
        let mut other: String = key.chars().take(key.chars().count().saturating_sub(1)).collect();
        other.push(last);
        prop_assume!(other != key && other.len() <= MAX_KEY_BYTES);
        prop_assert_ne!(check(&key)?, check(&other)?);
    }
}
