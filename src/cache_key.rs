//! The key of every per-key moka cache (the memory store's counters, the service's and
//! the client's deny-until caches): a `(limit, key)` at one window length, owned
//! ([`CacheKey`], what a cache stores) or borrowed ([`KeyRef`], what a lookup uses).
//!
//! Why one type for all three: each is looked up on every check of a key, and a lookup
//! by an owned key would allocate the caller's key (and touch the limit name's reference
//! count) once per check only to throw it away. A lookup builds a `KeyRef` of the
//! caller's strings instead, so it allocates nothing; only an insert builds a
//! `CacheKey`. Both hash and compare through [`KeyParts::parts`], which is what makes
//! the two interchangeable as moka keys (`Borrow`'s contract).
//!
//! The window length is part of the key so that one entry's window numbers are always
//! numbered alike: a limit whose length changes (a reload, or a client's stand-in
//! replaced by the real limit) starts new entries instead of comparing window numbers
//! of two scales. A cache that keys by limit name alone passes 0.

use crate::limits::Limit;
use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A stored key: the limit's name (shared with the limit), the caller's key, the
/// limit's window length in ms.
#[derive(Debug, Clone)]
pub(crate) struct CacheKey {
    pub(crate) limit: Arc<str>,
    pub(crate) key: Box<str>,
    pub(crate) window_ms: u64,
}

impl CacheKey {
    pub(crate) fn new(limit: Arc<str>, key: &str, window_ms: u64) -> Self {
        Self {
            limit,
            key: key.into(),
            window_ms,
        }
    }

    /// The key of `key` under `limit`, keyed with the limit's window length.
    pub(crate) fn of(limit: &Limit, key: &str) -> Self {
        Self::new(limit.name.clone(), key, limit.window_ms)
    }

    /// Bytes this key holds beyond its own size (its strings), for a cache's weigher.
    pub(crate) fn heap_len(&self) -> usize {
        self.limit.len() + self.key.len()
    }
}

/// A looked-up key: the caller's strings, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) limit: &'a str,
    pub(crate) key: &'a str,
    pub(crate) window_ms: u64,
}

impl<'a> KeyRef<'a> {
    pub(crate) fn new(limit: &'a str, key: &'a str, window_ms: u64) -> Self {
        Self {
            limit,
            key,
            window_ms,
        }
    }

    /// The borrowed [`CacheKey::of`]: what a check looks `key` under `limit` up by.
    pub(crate) fn of(limit: &'a Limit, key: &'a str) -> Self {
        Self::new(&limit.name, key, limit.window_ms)
    }

    /// What a cache lookup takes (`get(&k.dyn_ref())`).
    pub(crate) fn dyn_ref(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

/// A key's parts, owned ([`CacheKey`]) or borrowed ([`KeyRef`]).
pub(crate) trait KeyParts {
    fn parts(&self) -> (&str, &str, u64);
}

impl KeyParts for CacheKey {
    fn parts(&self) -> (&str, &str, u64) {
        (&self.limit, &self.key, self.window_ms)
    }
}

impl KeyParts for KeyRef<'_> {
    fn parts(&self) -> (&str, &str, u64) {
        (self.limit, self.key, self.window_ms)
    }
}

/// Up to this many bytes of limit and key are hashed in one `write` from the stack.
const ONE_WRITE: usize = 192;

impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (limit, key, window_ms) = self.parts();
        // One write of `limit 0xff key 0xff window` instead of the tuple's five: SipHash
        // pays its per-write bookkeeping once, on every check's lookup. 0xff never occurs
        // in UTF-8, so the bytes still tell every (limit, key) apart, as `str`'s own
        // `Hash` does with the same terminator.
        let len = limit.len() + key.len() + 10;
        if len > ONE_WRITE {
            return (limit, key, window_ms).hash(state);
        }
        let mut buf = [0u8; ONE_WRITE];
        buf[..limit.len()].copy_from_slice(limit.as_bytes());
        buf[limit.len()] = 0xff;
        let at = limit.len() + 1;
        buf[at..at + key.len()].copy_from_slice(key.as_bytes());
        buf[at + key.len()] = 0xff;
        let at = at + key.len() + 1;
        buf[at..at + 8].copy_from_slice(&window_ms.to_le_bytes());
        state.write(&buf[..len]);
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl Hash for CacheKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn KeyParts).hash(state);
    }
}

impl PartialEq for CacheKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for CacheKey {}

impl<'a> Borrow<dyn KeyParts + 'a> for CacheKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    #[test]
    fn an_owned_key_and_a_borrowed_one_hash_and_compare_alike() {
        let state = std::collections::hash_map::RandomState::new();
        let owned = CacheKey::new(Arc::from("mcp"), "tok", 60_000);
        let borrowed = KeyRef::new("mcp", "tok", 60_000);
        assert_eq!(
            state.hash_one(&owned as &dyn KeyParts),
            state.hash_one(borrowed.dyn_ref())
        );
        assert!(Borrow::<dyn KeyParts>::borrow(&owned) == borrowed.dyn_ref());
        let mut map = HashMap::new();
        map.insert(owned, 1);
        assert_eq!(map.get(borrowed.dyn_ref()), Some(&1));
        // Each part tells keys apart, including where one string ends and the next begins.
        for other in [
            KeyRef::new("mcp", "tok", 1_000),
            KeyRef::new("mcp", "to", 60_000),
            KeyRef::new("mc", "ptok", 60_000),
        ] {
            assert_eq!(map.get(other.dyn_ref()), None, "{other:?}");
        }
        assert_eq!(CacheKey::new(Arc::from("mcp"), "tok", 0).heap_len(), 6);
    }

    #[test]
    fn keys_on_both_sides_of_the_one_write_bound_hash_alike_owned_and_borrowed() {
        let state = std::collections::hash_map::RandomState::new();
        let mut map = HashMap::new();
        // limit 3 + key + 10 bytes of terminators and window: at, then past, the bound.
        let keys: Vec<String> = [ONE_WRITE - 13, ONE_WRITE - 12, ONE_WRITE * 4]
            .iter()
            .map(|&n| "k".repeat(n))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let owned = CacheKey::new(Arc::from("mcp"), key, 60_000);
            let borrowed = KeyRef::new("mcp", key, 60_000);
            assert_eq!(
                state.hash_one(&owned as &dyn KeyParts),
                state.hash_one(borrowed.dyn_ref()),
                "{} bytes",
                key.len()
            );
            map.insert(owned, i);
        }
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(map.get(KeyRef::new("mcp", key, 60_000).dyn_ref()), Some(&i));
        }
    }
}
