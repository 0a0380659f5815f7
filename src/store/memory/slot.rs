//! The memory store's keys: a slot is one `(limit, key)` at one window length, owned
//! ([`SlotKey`], what moka stores) or borrowed ([`Lookup`], what a hit is looked up by).
//!
//! The window length is part of the key so that one slot's windows are always numbered
//! alike: a limit whose length changes (a client's stand-in replaced by the real limit)
//! starts new counters instead of comparing window numbers of two scales.
//!
//! A hit builds a `Lookup` of the caller's strings, so the hot path allocates no key; only
//! a new slot builds an owned one. Both hash and compare through [`SlotRef::parts`], which
//! is what makes the two interchangeable as moka keys (`Borrow`'s contract).

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub(super) struct SlotKey {
    pub(super) limit: Arc<str>,
    pub(super) key: Box<str>,
    pub(super) window_ms: u64,
}

/// A slot key's parts, owned ([`SlotKey`]) or borrowed ([`Lookup`]). A hit looks its slot
/// up by a `Lookup` of the caller's strings, so the hot path allocates no key; only a new
/// slot builds an owned one. Both hash and compare through [`SlotRef::parts`], which is
/// what makes the two interchangeable as moka keys (`Borrow`'s contract).
pub(super) trait SlotRef {
    fn parts(&self) -> (&str, &str, u64);
}

impl SlotRef for SlotKey {
    fn parts(&self) -> (&str, &str, u64) {
        (&self.limit, &self.key, self.window_ms)
    }
}

pub(super) struct Lookup<'a> {
    pub(super) limit: &'a str,
    pub(super) key: &'a str,
    pub(super) window_ms: u64,
}

impl SlotRef for Lookup<'_> {
    fn parts(&self) -> (&str, &str, u64) {
        (self.limit, self.key, self.window_ms)
    }
}

impl Hash for dyn SlotRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn SlotRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn SlotRef + '_ {}

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn SlotRef).hash(state);
    }
}

impl PartialEq for SlotKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for SlotKey {}

impl<'a> Borrow<dyn SlotRef + 'a> for SlotKey {
    fn borrow(&self) -> &(dyn SlotRef + 'a) {
        self
    }
}
