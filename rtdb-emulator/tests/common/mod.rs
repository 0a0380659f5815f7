//! A tiny HTTP/1.1 client over a raw `TcpStream`, so the tests see exactly what is on the
//! wire (status, headers, body bytes, or a connection closed without any response) and the
//! crate needs no heavy HTTP client as a dev-dependency.

#![allow(dead_code)] // each test binary uses a different part of it

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A request under construction; every request uses its own connection
/// (`Connection: close`), which keeps response framing trivial.
#[derive(Debug, Clone)]
pub struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

pub fn req(method: &str, target: &str) -> Req {
    Req {
        method: method.to_owned(),
        target: target.to_owned(),
        headers: Vec::new(),
        body: None,
    }
}

impl Req {
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn owner(self) -> Req {
        self.header("Authorization", "Bearer owner")
    }

    pub fn etag(self) -> Req {
        self.header("X-Firebase-ETag", "true")
    }

    pub fn body(mut self, body: &str) -> Req {
        self.body = Some(body.as_bytes().to_vec());
        self
    }

    pub fn json(self, v: &Value) -> Req {
        let text = v.to_string();
        self.body(&text)
    }

    /// Sends the request; `Err` when the connection closed without a complete response.
    pub async fn send(&self, addr: SocketAddr) -> std::io::Result<Resp> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(&self.encode(addr, true)).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Resp::parse(&raw).map(|(resp, _)| resp)
    }

    /// Sends the request and returns every byte the server wrote before closing.
    pub async fn raw(&self, addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(&self.encode(addr, true)).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok(raw)
    }

    /// Sends the request and panics with context on a transport error.
    pub async fn go(&self, addr: SocketAddr) -> Resp {
        match self.send(addr).await {
            Ok(resp) => resp,
            Err(e) => panic!("{} {}: {e}", self.method, self.target),
        }
    }

    pub fn encode(&self, addr: SocketAddr, close: bool) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {addr}\r\n",
            self.method, self.target
        );
        if close {
            head.push_str("Connection: close\r\n");
        }
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        let body = self.body.clone().unwrap_or_default();
        if self.body.is_some() || matches!(self.method.as_str(), "PUT" | "POST" | "PATCH") {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&body);
        out
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    /// Parses one response from the front of `raw`; returns it and the bytes it used.
    pub fn parse(raw: &[u8]) -> std::io::Result<(Resp, usize)> {
        let eof = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "no complete response");
        let head_end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(eof)?;
        let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().ok_or_else(eof)?;
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(eof)?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let len = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let start = head_end + 4;
        let body = raw.get(start..start + len).ok_or_else(eof)?;
        let resp = Resp {
            status,
            headers,
            body: String::from_utf8_lossy(body).into_owned(),
        };
        Ok((resp, start + len))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        match serde_json::from_str(&self.body) {
            Ok(v) => v,
            Err(e) => panic!("body {:?} is not JSON: {e}", self.body),
        }
    }

    /// Asserts the status and that the body is `{"error": "<text>"}` with a string text;
    /// returns the text.
    pub fn assert_error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        let v = self.json();
        let obj = v.as_object().expect("error body is an object");
        assert_eq!(obj.len(), 1, "error body has only `error`: {v}");
        obj.get("error")
            .and_then(Value::as_str)
            .expect("`error` is a string")
            .to_owned()
    }
}
