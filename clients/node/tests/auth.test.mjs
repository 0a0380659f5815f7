// Cloud Run IAM: an ID token from a fake metadata server (GCE_METADATA_HOST), fetched
// once and reused until near expiry, sent as x-serverless-authorization; a front door
// that refuses calls without it stands for Cloud Run.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createRateLimiter } from "@bladbase/ratelimit";
import { startService, frontDoor, fakeMetadata, fakeJwt, freePort, memoryLogger, timed } from "./harness.mjs";

let service;
let door;
let metadata;
let token = fakeJwt(Math.floor(Date.now() / 1000) + 3600);
before(async () => {
  service = await startService();
  metadata = await fakeMetadata(() => token);
  process.env.GCE_METADATA_HOST = metadata.host;
  door = await frontDoor({
    upstream: service.address,
    gate: (h) => (h["x-serverless-authorization"] === `Bearer ${token}` ? undefined : { code: 16, message: "missing or bad ID token" }),
  });
});
after(async () => {
  await door.close();
  metadata.close();
  await service.stop();
});

test("cloudRunAuth: one metadata fetch for the service's audience, the token on every call", async (t) => {
  const limiter = createRateLimiter({ address: door.address, cloudRunAuth: true, learnLimits: false });
  t.after(() => limiter.close());
  const fetchesBefore = metadata.requests.length;
  const decisions = await Promise.all([1, 2, 3].map(() => limiter.check("frank")));
  for (let i = 0; i < 3; i++) decisions.push(await limiter.check("frank"));
  assert.ok(decisions.every((d) => d.shared && d.source === "store"), JSON.stringify(decisions));
  assert.equal(metadata.requests.length - fetchesBefore, 1, "fetched once, cached");
  const fetch = metadata.requests.at(-1);
  assert.deepEqual(fetch, {
    path: "/computeMetadata/v1/instance/service-accounts/default/identity",
    audience: `http://${door.address}`,
    format: "full",
    flavor: "Google",
  });
  const calls = door.seen.slice(-6);
  assert.ok(calls.every((c) => c.headers["x-serverless-authorization"] === `Bearer ${token}` && c.headers.authorization === undefined));
});

test("a token near its expiry is fetched again; the audience and header can be set", async (t) => {
  token = fakeJwt(Math.floor(Date.now() / 1000) + 120); // inside the 5-minute renewal margin
  const limiter = createRateLimiter({
    address: door.address, learnLimits: false,
    cloudRunAuth: { audience: "https://ratelimit-abc-ew.a.run.app", header: "x-serverless-authorization" },
  });
  t.after(() => limiter.close());
  const before = metadata.requests.length;
  await limiter.check("gina");
  await limiter.check("gina");
  assert.equal(metadata.requests.length - before, 2, "renewed before expiry");
  assert.equal(metadata.requests.at(-1).audience, "https://ratelimit-abc-ew.a.run.app");
  token = fakeJwt(Math.floor(Date.now() / 1000) + 3600);
});

test("no token (metadata server down): a local decision within the deadline, and no call to the service", async (t) => {
  const saved = process.env.GCE_METADATA_HOST;
  process.env.GCE_METADATA_HOST = `127.0.0.1:${await freePort()}`;
  const limiter = createRateLimiter({ address: door.address, cloudRunAuth: true, learnLimits: false, deadlineMs: 500, logger: memoryLogger() });
  t.after(() => {
    process.env.GCE_METADATA_HOST = saved;
    limiter.close();
  });
  const before = door.seen.length;
  const { value: d, ms } = await timed(() => limiter.check("hank"));
  assert.ok(ms <= 600, `took ${ms} ms`);
  assert.deepEqual([d.allowed, d.shared, d.source], [true, false, "client_fallback"]);
  assert.equal(door.seen.length, before, "no call without a token");
});

test("without cloudRunAuth the front door refuses (UNAUTHENTICATED) and the client decides locally", async (t) => {
  const limiter = createRateLimiter({ address: door.address, learnLimits: false, logger: memoryLogger() });
  t.after(() => limiter.close());
  const d = await limiter.check("ivy");
  assert.deepEqual([d.shared, d.source], [false, "client_fallback"]);
});
