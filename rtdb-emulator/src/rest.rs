//! The RTDB REST protocol: turns one HTTP request into database operations and a [`Reply`].
//!
//! This module owns the request semantics (`if-match` / `If-None-Match` /
//! `X-Firebase-ETag`, `print=silent`, rules checks, PUT/PATCH/POST/DELETE behaviour,
//! `/.settings/rules.json`); `request` parses what it reads from the request. It is
//! synchronous and knows nothing about sockets, faults or counters (see `server`), so the
//! protocol can be reasoned about on its own.
//!
//! Order of checks, chosen to match the official emulator where it is known: request shape
//! (400) → body (400) → on an `if-match` mismatch, 412 if the caller may read the location
//! and 401 otherwise (no data leak) → write permission (401) → apply.

use http::{HeaderMap, Method, Uri};
use serde_json::{Map, Value, json};

use crate::db::{Database, State};
use crate::request::{Headers, Params, caller, effective_method, query_pairs};
use crate::rules::{Caller, Rules, RulesError, parse_rules_text};
use crate::tree::{self, MAX_DEPTH, Normalizer, Path, TreeError};

/// The exact error text of the official emulator for `if-match` on GET, PATCH or POST.
pub const IF_MATCH_NOT_SUPPORTED: &str =
    "The 'if-match' header is not supported with GET, PATCH or POST requests";

/// Why a request was refused; each variant has one HTTP status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestError {
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("{0}")]
    BadRequest(String),
    #[error("Invalid rules: {0}")]
    Rules(#[from] RulesError),
    /// A rules denial (RTDB answers 401, not 403).
    #[error("Permission denied")]
    PermissionDenied,
    /// A non-owner touching `/.settings` (the official emulator answers 403).
    #[error("Permission denied")]
    Forbidden,
    #[error("{0}")]
    NotFound(String),
    #[error("Method not allowed")]
    MethodNotAllowed,
}

impl RestError {
    fn status(&self) -> u16 {
        match self {
            RestError::Tree(_) | RestError::BadRequest(_) | RestError::Rules(_) => 400,
            RestError::PermissionDenied => 401,
            RestError::Forbidden => 403,
            RestError::NotFound(_) => 404,
            RestError::MethodNotAllowed => 405,
        }
    }
}

/// The body of a reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    Empty,
    Json(Value),
}

/// What to answer; `server` turns it into an HTTP response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Body,
    pub etag: Option<String>,
    /// A data write was applied (counted in `Stats::writes`).
    pub wrote: bool,
    /// `print=pretty`.
    pub pretty: bool,
    /// Answer to a CORS preflight (`OPTIONS`).
    pub preflight: bool,
}

impl Reply {
    fn new(status: u16, body: Body) -> Reply {
        Reply {
            status,
            body,
            etag: None,
            wrote: false,
            pretty: false,
            preflight: false,
        }
    }

    pub fn json(status: u16, v: Value) -> Reply {
        Reply::new(status, Body::Json(v))
    }

    /// The `{"error": "<text>"}` reply every failure uses.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::json(status, json!({ "error": message }))
    }
}

/// The parts of an HTTP request the protocol looks at.
pub(crate) struct RestRequest<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

/// Handles one request under the database lock.
pub(crate) fn handle(db: &Database, req: &RestRequest<'_>) -> Reply {
    let pretty = matches!(query_pairs(req.uri), Ok(pairs) if pairs.iter().any(|(k, v)| k == "print" && v == "pretty"));
    let mut reply = match handle_inner(db, req) {
        Ok(reply) => reply,
        Err(e) => Reply::error(e.status(), &e.to_string()),
    };
    reply.pretty = pretty;
    reply
}

fn handle_inner(db: &Database, req: &RestRequest<'_>) -> Result<Reply, RestError> {
    if req.method == Method::OPTIONS {
        let mut reply = Reply::new(200, Body::Empty);
        reply.preflight = true;
        return Ok(reply);
    }
    let params = Params::parse(req.uri)?;
    let method = effective_method(req, &params)?;
    let caller = caller(req.headers, &params);
    let raw_path = req.uri.path();

    if raw_path == "/.settings/rules.json" {
        return db.with(|st| settings(st, &method, caller, &params, req.body));
    }
    let Some(data_path) = raw_path.strip_suffix(".json") else {
        return Err(RestError::NotFound(
            "Not found: REST paths end in .json (for example /.json or /a/b.json)".into(),
        ));
    };
    let path = Path::from_url(data_path)?;
    let headers = Headers::read(req.headers);
    if headers.if_match.is_some() && matches!(method, Method::GET | Method::PATCH | Method::POST) {
        return Err(RestError::BadRequest(IF_MATCH_NOT_SUPPORTED.into()));
    }
    let ctx = Ctx {
        path,
        caller,
        params,
        headers,
        now_ms: now_ms(),
    };
    match method {
        Method::GET => db.with(|st| get(st, &ctx)),
        Method::PUT => {
            let value = tree::parse_body(req.body)?;
            db.with(|st| put(st, &ctx, value))
        }
        Method::DELETE => db.with(|st| put(st, &ctx, Value::Null)),
        Method::POST => {
            let value = tree::parse_body(req.body)?;
            db.with(|st| post(st, &ctx, value))
        }
        Method::PATCH => {
            let value = tree::parse_body(req.body)?;
            db.with(|st| patch(st, &ctx, value))
        }
        _ => Err(RestError::MethodNotAllowed),
    }
}

/// Everything about a data request except the body.
struct Ctx {
    path: Path,
    caller: Caller,
    params: Params,
    headers: Headers,
    now_ms: i64,
}

impl Ctx {
    fn normalizer(&self) -> Normalizer {
        Normalizer {
            now_ms: self.now_ms,
        }
    }

    /// A successful reply, honouring `print=silent` (204, empty body).
    fn ok(&self, body: Value) -> Reply {
        if self.params.silent {
            Reply::new(204, Body::Empty)
        } else {
            Reply::json(200, body)
        }
    }
}

fn get(st: &mut State, ctx: &Ctx) -> Result<Reply, RestError> {
    let ns = st.namespace(&ctx.params.ns);
    if !ns.rules.can_read(&ctx.path, ctx.caller) {
        return Err(RestError::PermissionDenied);
    }
    let value = tree::get(&ns.data, &ctx.path)
        .map(tree::render)
        .unwrap_or(Value::Null);
    let etag =
        (ctx.headers.want_etag || ctx.headers.if_none_match.is_some()).then(|| tree::etag(&value));
    if let (Some(inm), Some(current)) = (&ctx.headers.if_none_match, &etag)
        && inm == current
    {
        let mut reply = Reply::new(304, Body::Empty);
        reply.etag = etag;
        return Ok(reply);
    }
    let body = if ctx.params.shallow {
        tree::shallow(&value)
    } else {
        value
    };
    let mut reply = ctx.ok(body);
    reply.etag = etag;
    Ok(reply)
}

/// PUT, and DELETE as a PUT of null; both may be conditional.
fn put(st: &mut State, ctx: &Ctx, value: Value) -> Result<Reply, RestError> {
    let ns = st.namespace(&ctx.params.ns);
    let current = tree::get(&ns.data, &ctx.path);
    let new_value = ctx.normalizer().normalize(value, ctx.path.len(), current)?;
    if let Some(if_match) = &ctx.headers.if_match {
        let current = current.map(tree::render).unwrap_or(Value::Null);
        let current_etag = tree::etag(&current);
        if *if_match != current_etag {
            if !ns.rules.can_read(&ctx.path, ctx.caller) {
                return Err(RestError::PermissionDenied);
            }
            let mut reply = Reply::json(412, current);
            reply.etag = Some(current_etag);
            return Ok(reply);
        }
    }
    if !ns.rules.can_write(&ctx.path, &new_value, ctx.caller) {
        return Err(RestError::PermissionDenied);
    }
    let rendered = tree::render(&new_value);
    tree::set(&mut ns.data, &ctx.path, new_value);
    let etag = ctx.headers.want_etag.then(|| tree::etag(&rendered));
    let mut reply = ctx.ok(rendered);
    reply.etag = etag;
    reply.wrote = true;
    Ok(reply)
}

fn post(st: &mut State, ctx: &Ctx, value: Value) -> Result<Reply, RestError> {
    let id = st.push_ids.next(ctx.now_ms);
    let path = ctx.path.child(&id);
    if path.len() >= MAX_DEPTH {
        return Err(TreeError::TooDeep.into());
    }
    let ns = st.namespace(&ctx.params.ns);
    let new_value = ctx.normalizer().normalize(value, path.len(), None)?;
    if !ns.rules.can_write(&path, &new_value, ctx.caller) {
        return Err(RestError::PermissionDenied);
    }
    let etag = ctx
        .headers
        .want_etag
        .then(|| tree::etag(&tree::render(&new_value)));
    tree::set(&mut ns.data, &path, new_value);
    let mut reply = ctx.ok(json!({ "name": id }));
    reply.etag = etag;
    reply.wrote = true;
    Ok(reply)
}

/// PATCH: each key of the body (a `/`-separated relative path) is written as its own
/// location; all of them are checked before any is applied, so the update is atomic.
fn patch(st: &mut State, ctx: &Ctx, value: Value) -> Result<Reply, RestError> {
    let Value::Object(children) = value else {
        return Err(RestError::BadRequest(
            "Invalid data; PATCH requires a JSON object of children to update".into(),
        ));
    };
    let ns = st.namespace(&ctx.params.ns);
    let mut writes = Vec::with_capacity(children.len());
    for (key, child) in children {
        let relative = Path::from_keys(&key)?;
        if relative.is_empty() {
            return Err(RestError::BadRequest(format!(
                "Invalid data; {key:?} is not a valid child path"
            )));
        }
        let path = ctx.path.join(&relative);
        if path.len() >= MAX_DEPTH {
            return Err(TreeError::TooDeep.into());
        }
        let current = tree::get(&ns.data, &path);
        let new_value = ctx.normalizer().normalize(child, path.len(), current)?;
        writes.push((path, key, new_value));
    }
    // Overlapping paths would make the result depend on the order of application. Sorted,
    // a path and its descendants are adjacent, so checking neighbours suffices.
    writes.sort_by(|a, b| a.0.cmp(&b.0));
    for pair in writes.windows(2) {
        if let [(a, a_key, _), (b, b_key, _)] = pair
            && a.is_prefix_of(b)
        {
            return Err(RestError::BadRequest(format!(
                "Invalid data; update paths {a_key:?} and {b_key:?} overlap"
            )));
        }
    }
    if !writes
        .iter()
        .all(|(path, _, v)| ns.rules.can_write(path, v, ctx.caller))
    {
        return Err(RestError::PermissionDenied);
    }
    let mut echo = Map::new();
    for (path, key, new_value) in writes {
        echo.insert(key, tree::render(&new_value));
        tree::set(&mut ns.data, &path, new_value);
    }
    let mut reply = ctx.ok(Value::Object(echo));
    reply.wrote = true;
    Ok(reply)
}

/// `/.settings/rules.json`: read or replace a namespace's rules; owner only.
fn settings(
    st: &mut State,
    method: &Method,
    caller: Caller,
    params: &Params,
    body: &[u8],
) -> Result<Reply, RestError> {
    if caller != Caller::Owner {
        return Err(RestError::Forbidden);
    }
    let ns = st.namespace(&params.ns);
    match *method {
        Method::GET => Ok(Reply::json(200, ns.rules.source().clone())),
        Method::PUT => {
            let text = std::str::from_utf8(body)
                .map_err(|_| RestError::BadRequest("rules must be UTF-8 text".into()))?;
            let rules = Rules::parse(&parse_rules_text(text)?)?;
            ns.rules = rules;
            Ok(Reply::json(200, json!({ "status": "ok" })))
        }
        _ => Err(RestError::MethodNotAllowed),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
