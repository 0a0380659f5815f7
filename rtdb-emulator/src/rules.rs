//! Security rules: parsing a `database.rules.json` document and deciding reads and writes.
//!
//! Only the subset a test needs is modelled, and anything outside it is rejected when the
//! rules are loaded (rather than silently misread): `.read`, `.write` and `.validate` whose
//! value is a boolean or one of the expressions `"true"`, `"false"`, `"auth != null"`,
//! `"auth == null"`; `.indexOn` (accepted, ignored: queries are not emulated); `$wildcard`
//! children. Semantics follow RTDB: deny by default; `.read`/`.write` cascade downward, so
//! a grant at an ancestor cannot be revoked deeper; `.validate` does not cascade and must
//! pass at every level of a non-null write.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::tree::Path;

/// Why a rules document was refused (HTTP 400 when loaded over REST).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("rules are not valid JSON: {0}")]
    Json(String),
    #[error("rules must be a JSON object of the form {{\"rules\": {{...}}}}")]
    Shape,
    #[error("unsupported rule {key:?} at {path}: {reason}")]
    Unsupported {
        path: String,
        key: String,
        reason: String,
    },
}

/// Who is asking, as far as rules are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `Authorization: Bearer owner`: bypasses all rules.
    Owner,
    /// Anyone else; `authenticated` is what `auth != null` evaluates to.
    Client { authenticated: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expr {
    Const(bool),
    AuthNotNull,
    AuthNull,
}

impl Expr {
    fn eval(self, authenticated: bool) -> bool {
        match self {
            Expr::Const(b) => b,
            Expr::AuthNotNull => authenticated,
            Expr::AuthNull => !authenticated,
        }
    }

    fn parse(v: &Value) -> Option<Expr> {
        match v {
            Value::Bool(b) => Some(Expr::Const(*b)),
            Value::String(s) => {
                let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
                match compact.as_str() {
                    "true" => Some(Expr::Const(true)),
                    "false" => Some(Expr::Const(false)),
                    "auth!=null" | "auth!==null" | "null!=auth" | "null!==auth" => {
                        Some(Expr::AuthNotNull)
                    }
                    "auth==null" | "auth===null" | "null==auth" | "null===auth" => {
                        Some(Expr::AuthNull)
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Node {
    read: Option<Expr>,
    write: Option<Expr>,
    validate: Option<Expr>,
    children: BTreeMap<String, Node>,
    /// The `$name` child, which matches any key without a literal sibling rule.
    wildcard: Option<Box<Node>>,
}

impl Node {
    fn parse(obj: &Value, path: &str) -> Result<Node, RulesError> {
        let Value::Object(map) = obj else {
            return Err(RulesError::Unsupported {
                path: path.to_owned(),
                key: String::new(),
                reason: "a rule node must be an object".into(),
            });
        };
        let mut node = Node::default();
        for (key, value) in map {
            let unsupported = |reason: &str| RulesError::Unsupported {
                path: if path.is_empty() {
                    "/".into()
                } else {
                    path.to_owned()
                },
                key: key.clone(),
                reason: reason.to_owned(),
            };
            let expr = || {
                Expr::parse(value).ok_or_else(|| {
                    unsupported(
                        "only true, false, \"auth != null\" and \"auth == null\" are supported",
                    )
                })
            };
            match key.as_str() {
                ".read" => node.read = Some(expr()?),
                ".write" => node.write = Some(expr()?),
                ".validate" => node.validate = Some(expr()?),
                ".indexOn" => {}
                k if k.starts_with('.') => return Err(unsupported("unknown rule type")),
                k if k.starts_with('$') => {
                    if node.wildcard.is_some() {
                        return Err(unsupported("only one $wildcard child is allowed per level"));
                    }
                    node.wildcard = Some(Box::new(Node::parse(value, &format!("{path}/{k}"))?));
                }
                k => {
                    let child = Node::parse(value, &format!("{path}/{k}"))?;
                    node.children.insert(k.to_owned(), child);
                }
            }
        }
        Ok(node)
    }

    fn child(&self, key: &str) -> Option<&Node> {
        self.children.get(key).or(self.wildcard.as_deref())
    }

    fn has_validate(&self) -> bool {
        self.validate.is_some()
            || self.children.values().any(Node::has_validate)
            || self.wildcard.as_ref().is_some_and(|w| w.has_validate())
    }
}

/// A parsed rules document.
#[derive(Debug, Clone)]
pub struct Rules {
    root: Node,
    /// The document as loaded, returned by `GET /.settings/rules.json`.
    source: Value,
    any_validate: bool,
}

impl Rules {
    /// Locked mode: no `.read`/`.write` anywhere, so every client request is denied.
    pub fn deny_all() -> Rules {
        Rules {
            root: Node::default(),
            source: serde_json::json!({"rules": {".read": false, ".write": false}}),
            any_validate: false,
        }
    }

    /// Parses a `{"rules": {...}}` document.
    pub fn parse(doc: &Value) -> Result<Rules, RulesError> {
        let Value::Object(top) = doc else {
            return Err(RulesError::Shape);
        };
        if top.len() != 1 {
            return Err(RulesError::Shape);
        }
        let rules = top.get("rules").ok_or(RulesError::Shape)?;
        let root = Node::parse(rules, "")?;
        let any_validate = root.has_validate();
        Ok(Rules {
            root,
            source: doc.clone(),
            any_validate,
        })
    }

    pub fn source(&self) -> &Value {
        &self.source
    }

    /// True when some `.read` at or above `path` grants access.
    pub fn can_read(&self, path: &Path, caller: Caller) -> bool {
        self.cascade(path, caller, |n| n.read)
    }

    /// True when some `.write` at or above `path` grants access and, for a non-null value,
    /// every `.validate` on the way and inside the written value passes.
    pub fn can_write(&self, path: &Path, new_value: &Value, caller: Caller) -> bool {
        self.cascade(path, caller, |n| n.write) && self.validates(path, new_value, caller)
    }

    fn cascade(&self, path: &Path, caller: Caller, pick: impl Fn(&Node) -> Option<Expr>) -> bool {
        let Caller::Client { authenticated } = caller else {
            return true;
        };
        let mut node = Some(&self.root);
        let mut keys = path.keys().iter();
        while let Some(n) = node {
            if pick(n).is_some_and(|e| e.eval(authenticated)) {
                return true;
            }
            node = keys.next().and_then(|k| n.child(k));
        }
        false
    }

    fn validates(&self, path: &Path, new_value: &Value, caller: Caller) -> bool {
        let Caller::Client { authenticated } = caller else {
            return true;
        };
        // `.validate` is not evaluated for deletes; skip the walk when there is none.
        if new_value.is_null() || !self.any_validate {
            return true;
        }
        let passes = |n: &Node| n.validate.is_none_or(|e| e.eval(authenticated));
        let mut node = &self.root;
        if !passes(node) {
            return false;
        }
        for key in path.keys() {
            match node.child(key) {
                Some(child) => node = child,
                None => return true,
            }
            if !passes(node) {
                return false;
            }
        }
        validate_subtree(node, new_value, authenticated)
    }
}

/// Checks `.validate` on every rule node that matches a (non-null) child of `value`.
fn validate_subtree(node: &Node, value: &Value, authenticated: bool) -> bool {
    let Value::Object(obj) = value else {
        return true;
    };
    obj.iter().all(|(key, child_value)| match node.child(key) {
        Some(child) => {
            child.validate.is_none_or(|e| e.eval(authenticated))
                && validate_subtree(child, child_value, authenticated)
        }
        None => true,
    })
}

/// Parses rules text as found in `database.rules.json`, which may contain `//` and
/// `/* */` comments (the Firebase tooling accepts them).
pub fn parse_rules_text(text: &str) -> Result<Value, RulesError> {
    let stripped = strip_comments(text);
    serde_json::from_str(&stripped).map_err(|e| RulesError::Json(e.to_string()))
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                '\\' => {
                    if let Some(escaped) = chars.next() {
                        out.push(escaped);
                    }
                }
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for skipped in chars.by_ref() {
                    if skipped == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut prev = '\0';
                for skipped in chars.by_ref() {
                    if prev == '*' && skipped == '/' {
                        break;
                    }
                    prev = skipped;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ANON: Caller = Caller::Client {
        authenticated: false,
    };
    const USER: Caller = Caller::Client {
        authenticated: true,
    };

    fn p(s: &str) -> Path {
        Path::unchecked(s)
    }

    #[test]
    fn deny_by_default_and_owner_bypass() {
        let r = Rules::deny_all();
        assert!(!r.can_read(&p(""), ANON));
        assert!(!r.can_write(&p("a"), &json!(1), USER));
        assert!(r.can_read(&p("a"), Caller::Owner));
        assert!(r.can_write(&p("a"), &json!(1), Caller::Owner));
    }

    #[test]
    fn grants_cascade_and_cannot_be_revoked() {
        let r = Rules::parse(&json!({"rules": {
            "public": {".read": true, "secret": {".read": false}},
            "users": {"$uid": {".write": "auth != null", ".read": "auth == null"}},
            "rateLimits": {".read": false, ".write": false}
        }}))
        .unwrap();
        assert!(r.can_read(&p("public/secret/x"), ANON));
        assert!(!r.can_read(&p(""), ANON));
        assert!(r.can_write(&p("users/bob/name"), &json!("x"), USER));
        assert!(!r.can_write(&p("users/bob"), &json!("x"), ANON));
        assert!(!r.can_write(&p("users"), &json!("x"), USER));
        assert!(r.can_read(&p("users/bob"), ANON));
        assert!(!r.can_read(&p("rateLimits/x"), USER));
    }

    #[test]
    fn literal_beats_wildcard() {
        let r = Rules::parse(&json!({"rules": {"$any": {".read": true}, "locked": {}}})).unwrap();
        assert!(r.can_read(&p("open"), ANON));
        assert!(!r.can_read(&p("locked"), ANON));
    }

    #[test]
    fn validate_is_checked_at_every_level_for_non_null_writes() {
        let r = Rules::parse(&json!({"rules": {".write": true,
            "a": {"b": {".validate": false}}}}))
        .unwrap();
        assert!(r.can_write(&p("a/c"), &json!(1), ANON));
        assert!(!r.can_write(&p("a/b"), &json!(1), ANON));
        assert!(!r.can_write(&p("a"), &json!({"b": 1}), ANON));
        assert!(r.can_write(&p("a/b"), &Value::Null, ANON));
        assert!(r.can_write(&p("a"), &json!({"b": 1}), Caller::Owner));
    }

    #[test]
    fn unsupported_rules_are_rejected() {
        for bad in [
            json!({"rules": {".read": "data.exists()"}}),
            json!({"rules": {".foo": true}}),
            json!({"rules": {".read": 1}}),
            json!({"rules": {"a": 1}}),
            json!({"rules": {}, "extra": 1}),
            json!({"notrules": {}}),
            json!([1]),
        ] {
            assert!(Rules::parse(&bad).is_err(), "{bad} should be rejected");
        }
        assert!(
            Rules::parse(&json!({"rules": {".indexOn": ["x"], ".read": "auth === null"}})).is_ok()
        );
    }

    #[test]
    fn rules_text_may_contain_comments() {
        let text = "{\n // locked\n \"rules\": { /* all */ \".read\": \"auth // x\", \".write\": false }\n}";
        // The `//` inside the string must survive; the comments must not.
        let v = parse_rules_text(text).unwrap();
        assert_eq!(v["rules"][".read"], json!("auth // x"));
        assert_eq!(v["rules"][".write"], json!(false));
    }
}
