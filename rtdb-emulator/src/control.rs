//! The emulator's own HTTP control endpoints under `/.emulator/`, for driving faults and
//! reading counters when the emulator runs as a separate process (benchmarks, other
//! languages). They bypass fault injection and are not counted, so observing the emulator
//! does not disturb it. `.emulator` is not a valid RTDB key, so no data path collides.
//!
//! - `GET /.emulator/stats` → the [`Stats`](crate::Stats) JSON
//! - `POST /.emulator/stats/reset` → zeroes the counters, answers what they held
//! - `GET /.emulator/faults` → the current [`FaultConfig`](crate::FaultConfig)
//! - `POST` or `PUT /.emulator/faults` with a `FaultConfig` JSON body → replaces the whole
//!   configuration (missing fields are off) and answers it
//! - `DELETE /.emulator/faults` → clears all faults and answers the (empty) configuration

use http::{Method, Request};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use serde::Serialize;

use crate::faults::FaultConfig;
use crate::rest::Reply;
use crate::server::{App, HttpResponse, to_response};

pub(crate) fn is_control_path(path: &str) -> bool {
    path == "/.emulator" || path.starts_with("/.emulator/")
}

pub(crate) async fn handle(app: &App, req: Request<Incoming>) -> HttpResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let reply = match (method, path.as_str()) {
        (Method::GET, "/.emulator/stats") => json(&app.counters.snapshot()),
        (Method::POST, "/.emulator/stats/reset") => json(&app.counters.reset()),
        (Method::GET, "/.emulator/faults") => json(&app.faults.config()),
        (Method::DELETE, "/.emulator/faults") => {
            app.faults.clear();
            json(&app.faults.config())
        }
        (Method::POST | Method::PUT, "/.emulator/faults") => {
            match Limited::new(req.into_body(), 64 * 1024).collect().await {
                Ok(body) => set_faults(app, &body.to_bytes()),
                Err(e) => Reply::error(400, &format!("could not read the body: {e}")),
            }
        }
        (_, "/.emulator/stats" | "/.emulator/stats/reset" | "/.emulator/faults") => {
            Reply::error(405, "Method not allowed")
        }
        _ => Reply::error(404, "Unknown emulator control endpoint"),
    };
    to_response(reply)
}

fn set_faults(app: &App, body: &[u8]) -> Reply {
    let cfg: FaultConfig = match serde_json::from_slice(body) {
        Ok(cfg) => cfg,
        Err(e) => return Reply::error(400, &format!("invalid fault configuration: {e}")),
    };
    match app.faults.set_config(cfg) {
        Ok(()) => json(&app.faults.config()),
        Err(e) => Reply::error(400, &format!("invalid fault configuration: {e}")),
    }
}

fn json(v: &impl Serialize) -> Reply {
    match serde_json::to_value(v) {
        Ok(v) => Reply::json(200, v),
        Err(e) => Reply::error(500, &e.to_string()),
    }
}
