//! Where the RTDB REST requests go: the database URL, the emulator convention, and the
//! node path of each counter.
//!
//! Production: `https://<db>.firebaseio.com` or `https://<db>.<region>.firebasedatabase.app`,
//! HTTPS required. Emulator (the Firebase convention, as the Admin SDKs do it):
//! `FIREBASE_DATABASE_EMULATOR_HOST=host:port` → `http://host:port`, with
//! `?ns=<first label of the database URL host>` on every request.
//!
//! Node layout: `{root}/{limit}/{encodedKey}.json`. Every segment is plain
//! `[A-Za-z0-9_-]` (root segments, limit names) or an encoded key (`[A-Za-z0-9_~-]`,
//! `keys.rs`), so nothing in a node URL needs percent-encoding: the path the URL names
//! is exactly the RTDB path. The root is at most [`keys::MAX_ROOT_BYTES`], which the
//! key budget assumes.

use super::keys;
use reqwest::Url;

/// Why an RTDB target could not be built.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    /// The database URL is not one of the two RTDB forms.
    #[error(
        "database URL {url:?}: {problem} (expected https://<db>.firebaseio.com or https://<db>.<region>.firebasedatabase.app)"
    )]
    DatabaseUrl { url: String, problem: String },
    /// `FIREBASE_DATABASE_EMULATOR_HOST` is not `host:port`.
    #[error(
        "FIREBASE_DATABASE_EMULATOR_HOST={value:?}: {problem} (expected host:port, e.g. 127.0.0.1:9000)"
    )]
    EmulatorHost { value: String, problem: String },
    /// The root path is not one this service can use.
    #[error(
        "RTDB root path {root:?}: must be 1 to {max} bytes of /-separated segments of A-Z a-z 0-9 _ - (at most {depth} segments)",
        max = keys::MAX_ROOT_BYTES,
        depth = MAX_ROOT_DEPTH
    )]
    Root { root: String },
}

/// Most segments in the root: RTDB paths must be under 32 levels deep, and the limit,
/// key and window add three.
pub const MAX_ROOT_DEPTH: usize = 8;

/// A resolved RTDB endpoint.
#[derive(Debug, Clone)]
pub struct Target {
    base: Url,
    ns: Option<String>,
    root: Vec<String>,
}

impl Target {
    /// Resolves `database_url`, in emulator mode when `emulator_host` is given.
    pub fn new(
        database_url: &str,
        emulator_host: Option<&str>,
        root: &str,
    ) -> Result<Self, TargetError> {
        let bad = |problem: &str| TargetError::DatabaseUrl {
            url: database_url.to_owned(),
            problem: problem.to_owned(),
        };
        let url = Url::parse(database_url.trim()).map_err(|e| bad(&e.to_string()))?;
        let host = url
            .host_str()
            .ok_or_else(|| bad("no host"))?
            .to_ascii_lowercase();
        let first_label = host.split('.').next().unwrap_or_default().to_owned();
        let rtdb_host =
            host.ends_with(".firebaseio.com") || host.ends_with(".firebasedatabase.app");
        if !rtdb_host || first_label.is_empty() {
            return Err(bad("not a Realtime Database host"));
        }
        if url.path() != "/" && !url.path().is_empty() {
            return Err(bad("must not have a path"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad(
                "must not have a query or fragment (the database is named by the host)",
            ));
        }
        let given = root;
        // One leading or trailing `/` is how paths are often written; an empty segment
        // inside (`a//b`) is a typo, refused rather than silently joined.
        let trimmed = given.strip_prefix('/').unwrap_or(given);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        let root: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
        if root.iter().any(String::is_empty)
            || root.len() > MAX_ROOT_DEPTH
            || root.join("/").len() > keys::MAX_ROOT_BYTES
            || !root.iter().all(|s| keys::is_plain_segment(s))
        {
            return Err(TargetError::Root {
                root: given.to_owned(),
            });
        }
        match emulator_host.map(str::trim).filter(|h| !h.is_empty()) {
            Some(h) => {
                let bad_host = |problem: &str| TargetError::EmulatorHost {
                    value: h.to_owned(),
                    problem: problem.to_owned(),
                };
                if h.contains("//") {
                    return Err(bad_host("must not include a scheme"));
                }
                let base =
                    Url::parse(&format!("http://{h}/")).map_err(|e| bad_host(&e.to_string()))?;
                if base.port().is_none() || base.path() != "/" {
                    return Err(bad_host("must be host:port"));
                }
                Ok(Self {
                    base,
                    ns: Some(first_label),
                    root,
                })
            }
            None => {
                if url.scheme() != "https" {
                    return Err(bad("production needs https"));
                }
                let base =
                    Url::parse(&format!("https://{host}/")).map_err(|e| bad(&e.to_string()))?;
                Ok(Self {
                    base,
                    ns: None,
                    root,
                })
            }
        }
    }

    /// True in emulator mode.
    pub fn is_emulator(&self) -> bool {
        self.ns.is_some()
    }

    /// The REST URL of `{root}/{limit}/{encoded_key}`.
    pub fn node_url(&self, limit: &str, encoded_key: &str) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.clear();
            segments.extend(self.root.iter().map(String::as_str));
            segments.push(limit);
            segments.push(&format!("{encoded_key}.json"));
        }
        if let Some(ns) = &self.ns {
            url.query_pairs_mut().append_pair("ns", ns);
        }
        url
    }

    /// The RTDB path (not URL) of a node, for logs and errors.
    pub fn node_path(&self, limit: &str, encoded_key: &str) -> String {
        format!("{}/{limit}/{encoded_key}", self.root.join("/"))
    }

    /// For the startup log: the base URL and namespace.
    pub fn describe(&self) -> String {
        match &self.ns {
            Some(ns) => format!("{}?ns={ns} (emulator)", self.base),
            None => self.base.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_production_url_forms_are_accepted() {
        let t = Target::new(
            "https://proj-default-rtdb.firebaseio.com",
            None,
            "rateLimits",
        )
        .expect("ok");
        let key = keys::encode("alice+1@example.com");
        assert_eq!(
            t.node_url("mcp", &key).as_str(),
            "https://proj-default-rtdb.firebaseio.com/rateLimits/mcp/alice~2B1~40example~2Ecom.json",
            "nothing is percent-encoded: the URL path is the RTDB path"
        );
        let t = Target::new(
            "https://proj-default-rtdb.europe-west1.firebasedatabase.app/",
            None,
            "rateLimits",
        )
        .expect("ok");
        assert!(!t.is_emulator());
        assert_eq!(
            t.node_url("mcp", "k").as_str(),
            "https://proj-default-rtdb.europe-west1.firebasedatabase.app/rateLimits/mcp/k.json"
        );
    }

    #[test]
    fn emulator_mode_uses_http_and_the_first_host_label_as_ns() {
        let t = Target::new(
            "https://proj-default-rtdb.europe-west1.firebasedatabase.app",
            Some("127.0.0.1:9000"),
            "/rateLimits/",
        )
        .expect("ok");
        assert!(t.is_emulator());
        assert_eq!(
            t.node_url("mcp", "k").as_str(),
            "http://127.0.0.1:9000/rateLimits/mcp/k.json?ns=proj-default-rtdb"
        );
        assert_eq!(t.node_path("mcp", "k"), "rateLimits/mcp/k");
    }

    #[test]
    fn bad_urls_hosts_and_roots_are_refused_with_a_reason() {
        let e = |u: &str| {
            Target::new(u, None, "rateLimits")
                .expect_err("refused")
                .to_string()
        };
        assert!(e("http://proj.firebaseio.com").contains("production needs https"));
        assert!(e("https://example.com").contains("not a Realtime Database host"));
        assert!(e("https://proj.firebaseio.com/x").contains("must not have a path"));
        assert!(e("https://proj.firebaseio.com/?ns=other").contains("must not have a query"));
        assert!(e("nonsense").contains("database URL \"nonsense\""));
        let h = |v: &str| {
            Target::new("https://p.firebaseio.com", Some(v), "rateLimits")
                .expect_err("refused")
                .to_string()
        };
        assert!(h("http://127.0.0.1:9000").contains("must not include a scheme"));
        assert!(h("127.0.0.1").contains("must be host:port"));
        let root = |r: &str| Target::new("https://p.firebaseio.com", None, r);
        let too_long = "r".repeat(keys::MAX_ROOT_BYTES + 1);
        let too_deep = "a/".repeat(MAX_ROOT_DEPTH + 1);
        for bad in [
            "rate.limits",
            "a+b",
            "a%2Fb",
            "ключ",
            "",
            "/",
            "a//b",
            "//a",
            "a//",
            &too_long,
            &too_deep,
        ] {
            match root(bad) {
                Err(TargetError::Root { root }) => assert_eq!(root, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        for good in ["/rateLimits", "rateLimits/", "a/b"] {
            assert!(root(good).is_ok(), "{good:?}");
        }
        let e = root("a b").expect_err("refused").to_string();
        assert!(e.contains("A-Z a-z 0-9 _ -"), "{e}");
        let longest = "r".repeat(keys::MAX_ROOT_BYTES);
        assert!(root(&longest).is_ok());
        assert!(root("apps/prod_1/rate-limits").is_ok());
    }
}
