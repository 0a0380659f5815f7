// The middleware through a real Express server (fetch against it), and the Express
// example in examples/ run as written.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import express from "express";
import { createRateLimiter } from "@bladbase/ratelimit";
import { startService, PACKAGE_DIR } from "./harness.mjs";

let service;
before(async () => {
  service = await startService({
    limits: `
[[limit]]
name = "tiny"
requests = 3
window = "1day"
default = true
`,
  });
});
after(() => service.stop());

async function serve(app) {
  const server = app.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

test("Express: headers on admitted responses, 429 + headers + JSON when refused, 400 for an unusable key, errors to next()", async (t) => {
  const limiter = createRateLimiter({ address: service.address });
  await limiter.listLimits();
  const app = express();
  app.use("/bad-limit", limiter.middleware({ limit: "nope", key: () => "k" }));
  app.use(limiter.middleware({ limit: "tiny", key: (req) => req.get("x-api-token") }));
  let handled = 0;
  app.get("/", (req, res) => {
    handled += 1;
    res.json({ ok: true });
  });
  app.get("/bad-limit", (req, res) => res.json({ ok: true }));
  app.use((err, req, res, next) => res.status(500).json({ error: err.code }));
  const http = await serve(app);
  t.after(() => {
    http.close();
    limiter.close();
  });
  const token = `tok-${process.pid}-${Date.now()}`;
  const get = (path = "/", headers = { "x-api-token": token }) => fetch(`${http.url}${path}`, { headers });
  for (let i = 0; i < 3; i++) {
    const r = await get();
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { ok: true });
    assert.equal(r.headers.get("x-ratelimit-limit"), "3");
    assert.equal(r.headers.get("x-ratelimit-remaining"), String(2 - i));
    assert.ok(Number(r.headers.get("x-ratelimit-reset")) > 0);
    assert.equal(r.headers.get("ratelimit-policy"), '"tiny";q=3;w=86400');
    assert.equal(r.headers.get("ratelimit"), `"tiny";r=${2 - i};t=${r.headers.get("x-ratelimit-reset")}`);
    assert.equal(r.headers.get("retry-after"), null);
  }
  const refused = await get();
  assert.equal(refused.status, 429);
  assert.match(refused.headers.get("content-type"), /^application\/json/);
  const body = await refused.json();
  assert.equal(refused.headers.get("retry-after"), String(body.retryAfterSeconds));
  assert.deepEqual({ ...body, retryAfterSeconds: typeof body.retryAfterSeconds }, { error: "rate_limited", message: "rate limit exceeded", limit: "tiny", retryAfterSeconds: "number" });
  assert.equal(refused.headers.get("x-ratelimit-remaining"), "0");
  assert.equal(handled, 3, "a refused request never reaches the handler");

  const anonymous = await get("/", {});
  assert.equal(anonymous.status, 200, "no key: passes unlimited");
  assert.equal(anonymous.headers.get("x-ratelimit-limit"), null);
  const empty = await get("/", { "x-api-token": "" });
  assert.equal(empty.status, 400);
  assert.deepEqual(await empty.json(), { error: "invalid_rate_limit_key", message: "key: must not be empty" });
  const misconfigured = await get("/bad-limit");
  assert.equal(misconfigured.status, 500);
  assert.deepEqual(await misconfigured.json(), { error: "NOT_FOUND" });
});

test("examples/express.mjs runs as written against a service with the built-in limits", async (t) => {
  const builtin = await startService();
  const child = spawn(process.execPath, [join(PACKAGE_DIR, "examples", "express.mjs")], {
    env: { ...process.env, RATELIMIT_ADDRESS: builtin.address, PORT: "0" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(async () => {
    child.kill("SIGKILL");
    await builtin.stop();
  });
  let out = "";
  const url = await new Promise((resolve, reject) => {
    child.stdout.on("data", (b) => {
      out += b;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`example exited ${code}: ${out}`)));
  });
  const token = `example-${process.pid}-${Date.now()}`;
  const r = await fetch(url, { headers: { "x-api-token": token } });
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { hello: token });
  assert.equal(r.headers.get("x-ratelimit-limit"), "120");
  assert.equal(r.headers.get("x-ratelimit-remaining"), "119");
  const anonymous = await fetch(url);
  assert.deepEqual([anonymous.status, await anonymous.json()], [200, { hello: "anonymous" }]);
});
