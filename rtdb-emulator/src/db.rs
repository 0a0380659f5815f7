//! The database state: one data tree and one rules set per namespace, behind one lock.
//!
//! A single mutex around everything is deliberate: it makes every request's
//! check-and-write atomic (an `if-match` comparison and the write it guards can never
//! interleave with another request), which is the property conditional requests rely on,
//! and it matches production RTDB, which processes one instance's operations one at a time.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use crate::pushid::PushIds;
use crate::rules::Rules;

/// Namespace used when a request has no `?ns=` parameter.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug)]
pub struct Namespace {
    /// Stored form (see `tree`): `Null` when the namespace is empty.
    pub data: Value,
    pub rules: Rules,
}

#[derive(Debug)]
pub struct State {
    namespaces: HashMap<String, Namespace>,
    /// Rules a namespace starts with (the emulator's `--rules`, else deny-all).
    default_rules: Rules,
    pub push_ids: PushIds,
}

impl State {
    /// The namespace, created empty (with the default rules) on first use.
    pub fn namespace(&mut self, name: &str) -> &mut Namespace {
        let default_rules = &self.default_rules;
        self.namespaces
            .entry(name.to_owned())
            .or_insert_with(|| Namespace {
                data: Value::Null,
                rules: default_rules.clone(),
            })
    }
}

#[derive(Debug)]
pub struct Database {
    state: Mutex<State>,
}

impl Database {
    pub fn new(default_rules: Rules) -> Database {
        Database {
            state: Mutex::new(State {
                namespaces: HashMap::new(),
                default_rules,
                push_ids: PushIds::default(),
            }),
        }
    }

    /// Runs `f` with exclusive access to the whole state. Keep `f` short and synchronous:
    /// every other request waits for it.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard: MutexGuard<'_, State> = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }
}
