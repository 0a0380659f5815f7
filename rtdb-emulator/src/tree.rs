//! The JSON data model of one database: paths, key validation, the stored tree, and ETags.
//!
//! This module owns every rule about *what* may be stored and *how it reads back*, so that
//! the REST layer and the library's direct accessors (`Emulator::value`/`set_value`)
//! cannot disagree about it.
//!
//! Stored form: a `serde_json::Value` with these invariants, which mirror RTDB's data model
//! (a tree of named children whose leaves are scalars):
//! - no `null` below the root, no empty objects (RTDB has no empty nodes: writing `{}`
//!   deletes, and parents left without children disappear);
//! - no arrays: RTDB stores an array as an object keyed `"0"`, `"1"`, ...; [`render`] turns
//!   such an object back into an array when it looks like one, as RTDB does on reads;
//! - numbers with an integral value are integers (`10`, never `10.0`), because RTDB keeps
//!   JS doubles and prints integral ones without a fraction.

use base64::Engine as _;
use serde_json::{Map, Number, Value};
use sha1::{Digest as _, Sha1};

/// A key may be at most this many bytes of UTF-8 (RTDB limits).
pub const MAX_KEY_BYTES: usize = 768;
/// A location may be at most `MAX_DEPTH - 1` keys deep ("less than 32 levels deep").
pub const MAX_DEPTH: usize = 32;
/// The ETag of an empty (null) location, as the official emulator reports it.
pub const NULL_ETAG: &str = "null_etag";

/// Everything that makes a path or a written value unacceptable; each maps to HTTP 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("Invalid path: {0}")]
    InvalidPath(String),
    #[error("Invalid data; couldn't parse JSON object, array, or value.")]
    InvalidJson,
    #[error("No data supplied.")]
    MissingData,
    #[error("Invalid data; invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error(
        "Invalid data; data is nested too deeply (a location must be less than {MAX_DEPTH} levels deep)"
    )]
    TooDeep,
    #[error("Invalid data; the request contains an unrecognized server value: {0}")]
    InvalidServerValue(String),
}

/// A location in the tree: a list of already validated (decoded) keys. The root is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Path(Vec<String>);

impl Path {
    /// Parses the path part of a REST URL (already stripped of `.json`). Each segment is
    /// percent-decoded on its own, so `%2F` yields a key containing `/`, which is then
    /// rejected like any other invalid key. Empty segments (`a//b`, leading `/`) are skipped.
    pub fn from_url(raw: &str) -> Result<Path, TreeError> {
        let mut keys = Vec::new();
        for seg in raw.split('/').filter(|s| !s.is_empty()) {
            let decoded = percent_encoding::percent_decode_str(seg)
                .decode_utf8()
                .map_err(|_| TreeError::InvalidPath(format!("{seg:?} is not valid UTF-8")))?;
            check_key(&decoded).map_err(|e| TreeError::InvalidPath(e.to_string()))?;
            keys.push(decoded.into_owned());
        }
        Path::checked(keys)
    }

    /// Parses a `/`-separated path of raw (not percent-encoded) keys, as used in the keys
    /// of a multi-path PATCH body. Keys are validated.
    pub fn from_keys(raw: &str) -> Result<Path, TreeError> {
        let mut keys = Vec::new();
        for seg in raw.split('/').filter(|s| !s.is_empty()) {
            check_key(seg)?;
            keys.push(seg.to_owned());
        }
        Path::checked(keys)
    }

    /// Splits a `/`-separated path without validating the keys: for trusted callers
    /// (test seeding through the library), which may deliberately store odd data.
    pub fn unchecked(raw: &str) -> Path {
        Path(
            raw.split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    fn checked(keys: Vec<String>) -> Result<Path, TreeError> {
        if keys.len() >= MAX_DEPTH {
            return Err(TreeError::InvalidPath(format!(
                "the path is {} levels deep; it must be less than {MAX_DEPTH}",
                keys.len()
            )));
        }
        Ok(Path(keys))
    }

    pub fn keys(&self) -> &[String] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn child(&self, key: &str) -> Path {
        let mut keys = self.0.clone();
        keys.push(key.to_owned());
        Path(keys)
    }

    pub fn join(&self, other: &Path) -> Path {
        let mut keys = self.0.clone();
        keys.extend(other.0.iter().cloned());
        Path(keys)
    }

    /// True when `self` is `other` or one of its ancestors.
    pub fn is_prefix_of(&self, other: &Path) -> bool {
        other.0.len() >= self.0.len() && other.0[..self.0.len()] == self.0[..]
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.0.join("/"))
    }
}

/// RTDB key rules: non-empty, at most 768 bytes, none of `. $ # [ ] /`, no ASCII control
/// characters (0x00-0x1F, 0x7F).
pub fn check_key(key: &str) -> Result<(), TreeError> {
    let reason = if key.is_empty() {
        Some("keys must not be empty")
    } else if key.len() > MAX_KEY_BYTES {
        Some("keys must be at most 768 bytes")
    } else if key
        .chars()
        .any(|c| matches!(c, '.' | '$' | '#' | '[' | ']' | '/'))
    {
        Some("keys must not contain '.', '$', '#', '[', ']' or '/'")
    } else if key.chars().any(|c| c.is_ascii_control()) {
        Some("keys must not contain ASCII control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(TreeError::InvalidKey {
            key: key.chars().take(64).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Parses a request body. An empty (or all-whitespace) body is "missing data".
pub fn parse_body(body: &[u8]) -> Result<Value, TreeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(TreeError::MissingData);
    }
    serde_json::from_slice(body).map_err(|_| TreeError::InvalidJson)
}

/// Context needed to turn a written value into stored form.
pub struct Normalizer {
    /// Milliseconds since the epoch, for `{".sv": "timestamp"}`.
    pub now_ms: i64,
}

impl Normalizer {
    /// Converts a written value at a location `depth` keys deep into stored form: validates
    /// keys and depth, resolves server values against `existing` (the data currently stored
    /// at that location), turns arrays into index-keyed objects, unwraps `.value`, drops
    /// `.priority` (priorities are not modelled), normalises numbers, and prunes nulls and
    /// empty containers. Returns `Value::Null` when nothing is left.
    pub fn normalize(
        &self,
        v: Value,
        depth: usize,
        existing: Option<&Value>,
    ) -> Result<Value, TreeError> {
        if depth >= MAX_DEPTH {
            return Err(TreeError::TooDeep);
        }
        match v {
            Value::Null | Value::Bool(_) | Value::String(_) => Ok(v),
            Value::Number(n) => Ok(Value::Number(normalize_number(n))),
            Value::Array(items) => {
                let mut out = Map::new();
                for (i, item) in items.into_iter().enumerate() {
                    let key = i.to_string();
                    let child = self.normalize(item, depth + 1, child_of(existing, &key))?;
                    if !child.is_null() {
                        out.insert(key, child);
                    }
                }
                Ok(object_or_null(out))
            }
            Value::Object(mut obj) => {
                if let Some(sv) = obj.remove(".sv") {
                    if !obj.is_empty() {
                        return Err(TreeError::InvalidServerValue(
                            "'.sv' must be the only key of its object".into(),
                        ));
                    }
                    return self.server_value(sv, existing);
                }
                if let Some(inner) = obj.remove(".value") {
                    // `{".value": v, ".priority": p}` is the export format of a leaf.
                    return self.normalize(inner, depth, existing);
                }
                obj.remove(".priority");
                let mut out = Map::new();
                for (key, child) in obj {
                    check_key(&key)?;
                    let child = self.normalize(child, depth + 1, child_of(existing, &key))?;
                    if !child.is_null() {
                        out.insert(key, child);
                    }
                }
                Ok(object_or_null(out))
            }
        }
    }

    fn server_value(&self, sv: Value, existing: Option<&Value>) -> Result<Value, TreeError> {
        match sv {
            Value::String(s) if s == "timestamp" => Ok(Value::from(self.now_ms)),
            Value::Object(ref op) if op.len() == 1 && op.contains_key("increment") => {
                match op.get("increment") {
                    Some(Value::Number(delta)) => {
                        // A missing or non-numeric current value is replaced by the delta.
                        let current = match existing {
                            Some(Value::Number(n)) => Some(n),
                            _ => None,
                        };
                        Ok(Value::Number(add_numbers(current, delta)))
                    }
                    _ => Err(TreeError::InvalidServerValue(
                        "increment needs a numeric delta".into(),
                    )),
                }
            }
            other => Err(TreeError::InvalidServerValue(other.to_string())),
        }
    }
}

/// Structural normalisation only (arrays to objects, numbers, pruning), with no key, depth
/// or server-value processing: for trusted seeding through the library, which may want to
/// store data a client could not write.
pub fn normalize_trusted(v: Value) -> Value {
    match v {
        Value::Number(n) => Value::Number(normalize_number(n)),
        Value::Array(items) => object_or_null(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| (i.to_string(), normalize_trusted(item)))
                .filter(|(_, c)| !c.is_null())
                .collect(),
        ),
        Value::Object(obj) => object_or_null(
            obj.into_iter()
                .map(|(k, c)| (k, normalize_trusted(c)))
                .filter(|(_, c)| !c.is_null())
                .collect(),
        ),
        scalar => scalar,
    }
}

fn child_of<'a>(existing: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    existing
        .and_then(|v| v.as_object())
        .and_then(|o| o.get(key))
}

fn object_or_null(obj: Map<String, Value>) -> Value {
    if obj.is_empty() {
        Value::Null
    } else {
        Value::Object(obj)
    }
}

/// Integral doubles become integers so that they print as `10`, not `10.0`.
fn normalize_number(n: Number) -> Number {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() => float_to_number(f),
        _ => n,
    }
}

fn float_to_number(f: f64) -> Number {
    // Only within ±2^53 is every integer exactly representable, so the conversion is lossless.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if f.fract() == 0.0 && f.abs() <= EXACT {
        Number::from(f as i64)
    } else {
        // `from_f64` only fails for NaN/inf, which JSON input cannot produce; fall back to 0.
        Number::from_f64(f).unwrap_or_else(|| Number::from(0))
    }
}

/// `current + delta` with RTDB's rules: integers stay integers unless either side is a
/// float or the sum overflows, in which case the sum is computed as a double.
fn add_numbers(current: Option<&Number>, delta: &Number) -> Number {
    let Some(current) = current else {
        return normalize_number(delta.clone());
    };
    if let (Some(a), Some(b)) = (current.as_i64(), delta.as_i64())
        && let Some(sum) = a.checked_add(b)
    {
        return Number::from(sum);
    }
    let a = current.as_f64().unwrap_or(0.0);
    let b = delta.as_f64().unwrap_or(0.0);
    float_to_number(a + b)
}

/// The stored value at `path`, if any.
pub fn get<'a>(root: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut node = root;
    for key in path.keys() {
        node = node.as_object()?.get(key)?;
    }
    if node.is_null() { None } else { Some(node) }
}

/// Stores `value` (already in stored form; `Null` deletes) at `path`, creating parents as
/// needed (a scalar parent is replaced by an object, as RTDB does) and removing parents
/// left empty.
pub fn set(root: &mut Value, path: &Path, value: Value) {
    set_in(root, path.keys(), value);
}

fn set_in(node: &mut Value, keys: &[String], value: Value) {
    let Some((first, rest)) = keys.split_first() else {
        *node = value;
        return;
    };
    if value.is_null() && !node.is_object() {
        // Deleting below a scalar or below nothing: nothing to do.
        return;
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    let Value::Object(obj) = node else {
        return;
    };
    let child = obj.entry(first.clone()).or_insert(Value::Null);
    set_in(child, rest, value);
    if child.is_null() {
        obj.remove(first);
    }
    if obj.is_empty() {
        *node = Value::Null;
    }
}

/// Turns stored form into what a read returns: objects keyed by array indexes become arrays
/// when more than half of the indexes `0..=max` are present (missing ones read as `null`),
/// which is the rule RTDB applies.
pub fn render(v: &Value) -> Value {
    match v {
        Value::Object(obj) => {
            if let Some(arr) = as_array(obj) {
                return Value::Array(arr);
            }
            Value::Object(obj.iter().map(|(k, c)| (k.clone(), render(c))).collect())
        }
        other => other.clone(),
    }
}

fn as_array(obj: &Map<String, Value>) -> Option<Vec<Value>> {
    let mut max = 0usize;
    for key in obj.keys() {
        // Canonical indexes only: "0", "7", never "07" or "+7".
        let canonical =
            key == "0" || (!key.starts_with('0') && key.bytes().all(|b| b.is_ascii_digit()));
        if !canonical {
            return None;
        }
        max = max.max(key.parse::<usize>().ok()?);
    }
    if obj.is_empty() || max >= 2 * obj.len() {
        return None;
    }
    let mut arr = vec![Value::Null; max + 1];
    for (key, child) in obj {
        let i = key.parse::<usize>().ok()?;
        *arr.get_mut(i)? = render(child);
    }
    Some(arr)
}

/// The ETag of a rendered value: `null_etag` for null, otherwise base64(SHA-1(canonical
/// JSON)). Canonical JSON sorts object keys and has no whitespace, so equal content always
/// gives an equal ETag (like the official emulator, including the A→B→A case).
pub fn etag(rendered: &Value) -> String {
    if rendered.is_null() {
        return NULL_ETAG.to_owned();
    }
    let mut canonical = String::new();
    write_canonical(rendered, &mut canonical);
    let digest = Sha1::digest(canonical.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(obj) => {
            let mut keys: Vec<&String> = obj.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(child) = obj.get(key) {
                    write_canonical(child, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `shallow=true`: a scalar as is, an object's keys mapped to `true`.
pub fn shallow(rendered: &Value) -> Value {
    match rendered {
        Value::Object(obj) => {
            Value::Object(obj.keys().map(|k| (k.clone(), Value::Bool(true))).collect())
        }
        Value::Array(items) => Value::Object(
            items
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_null())
                .map(|(i, _)| (i.to_string(), Value::Bool(true)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn norm(v: Value) -> Result<Value, TreeError> {
        Normalizer { now_ms: 1_000 }.normalize(v, 0, None)
    }

    #[test]
    fn url_paths_are_decoded_per_segment_and_validated() {
        let p = Path::from_url("/a/b%25c/%C3%A9t%C3%A9").unwrap();
        assert_eq!(p.keys(), ["a", "b%c", "été"]);
        assert_eq!(Path::from_url("//a//").unwrap().keys(), ["a"]);
        assert!(Path::from_url("/").unwrap().is_empty());
        for bad in [
            "/a%2Fb", "/a.b", "/a$", "/a%23", "/a[", "/a]", "/a%00", "/a%7F", "/a%1F", "/%FF",
        ] {
            assert!(Path::from_url(bad).is_err(), "{bad} should be rejected");
        }
        assert!(Path::from_url(&format!("/{}", "k".repeat(768))).is_ok());
        assert!(Path::from_url(&format!("/{}", "k".repeat(769))).is_err());
        let deep31 = "/a".repeat(31);
        assert!(Path::from_url(&deep31).is_ok());
        assert!(Path::from_url(&format!("{deep31}/a")).is_err());
    }

    #[test]
    fn written_values_are_validated_and_pruned() {
        assert_eq!(
            norm(json!({"a": {}, "b": [], "c": null, "d": 1})).unwrap(),
            json!({"d": 1})
        );
        assert_eq!(norm(json!({"a": {"b": {}}})).unwrap(), Value::Null);
        assert_eq!(norm(json!(10.0)).unwrap(), json!(10));
        assert_eq!(norm(json!(1.5)).unwrap(), json!(1.5));
        assert_eq!(
            norm(json!(["x", null, "z"])).unwrap(),
            json!({"0": "x", "2": "z"})
        );
        assert!(matches!(
            norm(json!({"a.b": 1})),
            Err(TreeError::InvalidKey { .. })
        ));
        assert!(matches!(
            norm(json!({"a\n": 1})),
            Err(TreeError::InvalidKey { .. })
        ));
        assert!(matches!(
            norm(json!({"": 1})),
            Err(TreeError::InvalidKey { .. })
        ));
        let mut deep = json!(1);
        for _ in 0..32 {
            deep = json!({ "k": deep });
        }
        assert_eq!(norm(deep), Err(TreeError::TooDeep));
    }

    #[test]
    fn server_values() {
        let n = Normalizer { now_ms: 42 };
        assert_eq!(
            n.normalize(json!({".sv": "timestamp"}), 0, None).unwrap(),
            json!(42)
        );
        let inc = json!({".sv": {"increment": 2}});
        assert_eq!(n.normalize(inc.clone(), 0, None).unwrap(), json!(2));
        assert_eq!(
            n.normalize(inc.clone(), 0, Some(&json!(40))).unwrap(),
            json!(42)
        );
        assert_eq!(n.normalize(inc, 0, Some(&json!(0.5))).unwrap(), json!(2.5));
        assert!(n.normalize(json!({".sv": "nope"}), 0, None).is_err());
    }

    #[test]
    fn set_creates_and_prunes_parents() {
        let mut root = Value::Null;
        set(&mut root, &Path::unchecked("a/b/c"), json!(1));
        set(&mut root, &Path::unchecked("a/x"), json!(2));
        assert_eq!(root, json!({"a": {"b": {"c": 1}, "x": 2}}));
        set(&mut root, &Path::unchecked("a/b/c"), Value::Null);
        assert_eq!(root, json!({"a": {"x": 2}}));
        set(&mut root, &Path::unchecked("a/x/deeper"), json!(3));
        assert_eq!(root, json!({"a": {"x": {"deeper": 3}}}));
        set(&mut root, &Path::unchecked("zz/q"), Value::Null);
        assert_eq!(root, json!({"a": {"x": {"deeper": 3}}}));
        set(&mut root, &Path::unchecked("a/x/deeper"), Value::Null);
        assert_eq!(root, Value::Null);
    }

    #[test]
    fn arrays_render_back_when_dense_enough() {
        assert_eq!(render(&json!({"0": "a", "1": "b"})), json!(["a", "b"]));
        assert_eq!(
            render(&json!({"0": "a", "2": "c"})),
            json!(["a", null, "c"])
        );
        assert_eq!(
            render(&json!({"0": "a", "5": "c"})),
            json!({"0": "a", "5": "c"})
        );
        assert_eq!(render(&json!({"01": "a"})), json!({"01": "a"}));
    }

    #[test]
    fn etags_depend_on_content_only() {
        assert_eq!(etag(&Value::Null), NULL_ETAG);
        let a = etag(&json!({"x": 1, "y": [1, 2]}));
        assert_eq!(a.len(), 28);
        assert_eq!(a, etag(&json!({"y": [1, 2], "x": 1})));
        assert_ne!(a, etag(&json!({"x": 2, "y": [1, 2]})));
        assert_eq!(etag(&json!(10)), etag(&norm(json!(10.0)).unwrap()));
    }
}
