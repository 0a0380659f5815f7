// Test harness (not a test file): the real `ratelimit` binary on loopback, and the
// loopback stand-ins the tests need around it — a black hole (accepts, never answers;
// counts connections, bytes and HTTP/2 HEADERS frames, i.e. RPCs), a front door
// (an HTTP/2 proxy in front of the binary that counts RPCs by method, can require an ID
// token like Cloud Run IAM, or answer a gRPC status itself), and a fake metadata server.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, writeFileSync, existsSync } from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO_DIR = resolve(PACKAGE_DIR, "..", "..");

/** The binary built by `cargo build --bin ratelimit` (or `cargo test`). */
export function ratelimitBin() {
  const bin =
    process.env.RATELIMIT_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(REPO_DIR, "target"), "debug", "ratelimit");
  if (!existsSync(bin)) throw new Error(`no ratelimit binary at ${bin}: run \`cargo build --bin ratelimit\` first (or set RATELIMIT_BIN)`);
  return bin;
}

/** A TCP port free right now on 127.0.0.1. */
export async function freePort() {
  const s = net.createServer();
  s.listen(0, "127.0.0.1");
  await once(s, "listening");
  const { port } = s.address();
  s.close();
  await once(s, "close");
  return port;
}

async function waitForPort(port, child, log) {
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`ratelimit exited (${child.exitCode}):\n${log()}`);
    const ok = await new Promise((res) => {
      const c = net.connect(port, "127.0.0.1");
      c.once("connect", () => (c.destroy(), res(true)));
      c.once("error", () => res(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`ratelimit did not listen on ${port}:\n${log()}`);
}

/**
 * Starts `ratelimit serve` on a free loopback port. `limits`: TOML text of a limits file
 * (default: none, the built-in `mcp` = 120 / 60 s).
 */
export async function startService({ limits, adminToken, port } = {}) {
  const listenPort = port ?? (await freePort());
  const args = ["serve", "--listen", `127.0.0.1:${listenPort}`, "--drain-timeout", "1s"];
  if (limits !== undefined) {
    const dir = mkdtempSync(join(tmpdir(), "rl-node-"));
    const file = join(dir, "limits.toml");
    writeFileSync(file, limits);
    args.push("--limits", file);
  }
  const env = { ...process.env, RATELIMIT_LOG_FORMAT: "text" };
  if (adminToken !== undefined) env.RATELIMIT_ADMIN_TOKEN = adminToken;
  const child = spawn(ratelimitBin(), args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (b) => (stderr += b));
  await waitForPort(listenPort, child, () => stderr);
  return {
    port: listenPort,
    address: `127.0.0.1:${listenPort}`,
    log: () => stderr,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGKILL");
      await once(child, "exit");
    },
  };
}

/**
 * A listener that accepts connections and never answers a call. `mode: "silent"` never
 * writes a byte (the HTTP/2 handshake never completes); `mode: "late"` completes the
 * handshake (its SETTINGS) and takes every call, answering none.
 */
export async function blackHole({ mode = "late" } = {}) {
  const stats = { connections: 0, bytes: 0, rpcs: 0 };
  const sockets = new Set();
  const server = net.createServer((socket) => {
    stats.connections += 1;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    let buf = Buffer.alloc(0);
    let prefaceSeen = false;
    if (mode === "late") socket.write(Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])); // empty SETTINGS
    socket.on("data", (chunk) => {
      stats.bytes += chunk.length;
      if (mode !== "late") return;
      buf = Buffer.concat([buf, chunk]);
      if (!prefaceSeen) {
        if (buf.length < 24) return;
        buf = buf.subarray(24);
        prefaceSeen = true;
      }
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const type = buf[3];
        const flags = buf[4];
        if (type === 0x1) stats.rpcs += 1; // HEADERS: a new call
        if (type === 0x4 && (flags & 0x1) === 0) socket.write(Buffer.from([0, 0, 0, 4, 1, 0, 0, 0, 0])); // SETTINGS ACK
        buf = buf.subarray(9 + len);
      }
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    address: `127.0.0.1:${server.address().port}`,
    stats,
    async close() {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

/** gRPC's percent-encoding of grpc-message: only '%' and bytes outside printable ASCII. */
const grpcMessage = (m) => [...Buffer.from(m)].map((b) => (b < 0x20 || b > 0x7e || b === 0x25 ? `%${b.toString(16).toUpperCase().padStart(2, "0")}` : String.fromCharCode(b))).join("");

const HOP = new Set(["connection", "keep-alive", "host", "http2-settings", "proxy-connection", "transfer-encoding", "upgrade"]);

/**
 * An HTTP/2 proxy in front of `upstream` (host:port) that counts calls by method
 * (`calls["Check"]`) and records each call's headers. `gate(headers)` may answer a call
 * itself: return `{ code, message }` for a gRPC status, or undefined to forward it.
 */
export async function frontDoor({ upstream, gate } = {}) {
  const calls = {};
  const seen = [];
  let session;
  const upstreamSession = () => {
    if (session === undefined || session.closed || session.destroyed) {
      session = http2.connect(`http://${upstream}`);
      session.on("error", () => {});
    }
    return session;
  };
  const server = http2.createServer();
  server.on("stream", (stream, headers) => {
    stream.on("error", () => {});
    const method = String(headers[":path"]).split("/").pop();
    calls[method] = (calls[method] ?? 0) + 1;
    seen.push({ method, headers: { ...headers } });
    const answer = gate?.(headers);
    const out = {};
    for (const [k, v] of Object.entries(headers)) if (!k.startsWith(":") && !HOP.has(k)) out[k] = v;
    if (answer !== undefined || upstream === undefined) {
      const { code = 14, message = "no upstream" } = answer ?? {};
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": String(code), "grpc-message": grpcMessage(message) }, { endStream: true });
      return;
    }
    const req = upstreamSession().request({ ":method": "POST", ":path": headers[":path"], ...out });
    req.on("error", () => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
    stream.pipe(req);
    let trailers = {};
    req.on("trailers", (t) => (trailers = t));
    req.on("response", (h) => {
      const rh = {};
      for (const [k, v] of Object.entries(h)) if (!k.startsWith(":") || k === ":status") rh[k] = v;
      if (h["grpc-status"] !== undefined) {
        stream.respond(rh, { endStream: true });
        return;
      }
      stream.respond(rh, { waitForTrailers: true });
      stream.on("wantTrailers", () => {
        const t = {};
        for (const [k, v] of Object.entries(trailers)) if (!k.startsWith(":")) t[k] = v;
        stream.sendTrailers(t);
      });
      req.pipe(stream);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    address: `127.0.0.1:${server.address().port}`,
    calls,
    seen,
    async close() {
      session?.destroy();
      server.close();
    },
  };
}

/** A JWT-shaped token (unsigned; only its `exp` is read) expiring at `expSeconds`. */
export function fakeJwt(expSeconds, aud = "test") {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "RS256", typ: "JWT" })}.${b64({ aud, exp: expSeconds, iat: expSeconds - 3600 })}.c2ln`;
}

/** A fake GCE metadata server handing out `token()` as the identity token; counts requests. */
export async function fakeMetadata(token) {
  const requests = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    requests.push({ path: url.pathname, audience: url.searchParams.get("audience"), format: url.searchParams.get("format"), flavor: req.headers["metadata-flavor"] });
    if (url.pathname !== "/computeMetadata/v1/instance/service-accounts/default/identity" || req.headers["metadata-flavor"] !== "Google") {
      res.writeHead(404, { "Metadata-Flavor": "Google" }).end("not found");
      return;
    }
    res.writeHead(200, { "Metadata-Flavor": "Google", "content-type": "application/text" }).end(token());
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { host: `127.0.0.1:${server.address().port}`, requests, close: () => server.close() };
}

/** A logger that keeps its lines. */
export function memoryLogger() {
  const lines = [];
  return {
    lines,
    warn: (message, fields) => lines.push({ level: "warn", message, fields }),
    info: (message, fields) => lines.push({ level: "info", message, fields }),
  };
}

/** Milliseconds `fn` takes, with its result. */
export async function timed(fn) {
  const t0 = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - t0 };
}
