// When the service cannot answer: the client's own window, the limit's failure policy,
// the stand-in rule for a limit nobody told the client about, and the way back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRateLimiter, ManualClock } from "@bladbase/ratelimit";
import { startService, freePort, memoryLogger, timed } from "./harness.mjs";

const unique = (what) => `${what}-${process.pid}-${Math.random().toString(36).slice(2)}`;

test("service stopped mid-run: local decisions (shared: false) within the deadline, one warning, then shared again", async (t) => {
  const service = await startService();
  const logger = memoryLogger();
  const limiter = createRateLimiter({ address: service.address, logger, learnLimits: false });
  let again;
  t.after(async () => {
    limiter.close();
    await service.stop();
    await again?.stop();
  });
  const key = unique("midrun");
  for (let i = 0; i < 10; i++) {
    const d = await limiter.check(key);
    assert.equal(d.shared, true);
    assert.equal(d.remaining, 119 - i);
  }
  await service.stop();
  for (let i = 0; i < 3; i++) {
    const { value: d, ms } = await timed(() => limiter.check(key));
    assert.ok(ms <= 1500 + 100, `answered in ${ms} ms`);
    assert.equal(d.shared, false);
    assert.equal(d.source, "client_fallback");
    assert.equal(d.allowed, true);
    assert.equal(d.remaining, 119 - i, "this process's own window counts from its own hits");
    assert.equal(d.limitName, "mcp");
    assert.equal(d.window, Math.floor(Date.now() / 60_000));
  }
  const warnings = logger.lines.filter((l) => l.level === "warn");
  assert.equal(warnings.length, 1, JSON.stringify(logger.lines));
  assert.match(warnings[0].message, /deciding locally \(shared=false\)/);

  again = await startService({ port: service.port });
  const d = await limiter.check(key);
  assert.equal(d.shared, true, "the service answers again");
  assert.equal(d.source, "store");
  const back = logger.lines.filter((l) => l.level === "info");
  assert.equal(back.length, 1);
  assert.equal(back[0].fields.localDecisions, 3);
});

test("failure policies learned from ListLimits apply exactly as in the service while it is down", async (t) => {
  const service = await startService({
    limits: `
[[limit]]
name = "tiny"
requests = 2
window = "60s"
default = true

[[limit]]
name = "signin"
requests = 5
window = "15m"
on_store_failure = "deny"

[[limit]]
name = "uploads"
requests = 20
window = "1h"
on_store_failure = "allow"
`,
  });
  const clock = new ManualClock(1_764_518_400_000); // a window start: 2025-11-30T16:00:00Z
  const limiter = createRateLimiter({ address: service.address, clock, learnLimits: false, logger: memoryLogger() });
  t.after(async () => {
    limiter.close();
    await service.stop();
  });
  await limiter.listLimits();
  await service.stop();

  for (let i = 0; i < 5; i++) {
    const d = await limiter.check("alice", { limit: "signin" });
    assert.deepEqual(d, {
      allowed: false, limit: 5, remaining: 0, resetAfterSeconds: 900, retryAfterSeconds: 900,
      shared: false, source: "failure_policy", limitName: "signin", window: 1_764_518_400_000 / 900_000,
    });
  }
  // A peek meets the policy a check would: none left under deny, every hit under allow.
  const signinPeek = await limiter.peek("alice", { limit: "signin" });
  assert.deepEqual(
    [signinPeek.allowed, signinPeek.remaining, signinPeek.source, signinPeek.retryAfterSeconds],
    [false, 0, "failure_policy", 900],
  );
  const uploadsPeek = await limiter.peek("alice", { limit: "uploads" });
  assert.deepEqual([uploadsPeek.allowed, uploadsPeek.remaining, uploadsPeek.source], [true, 20, "failure_policy"]);
  for (let i = 0; i < 30; i++) {
    const d = await limiter.check("alice", { limit: "uploads" });
    assert.equal(d.allowed, true, "allow admits past the limit: it counts nothing");
    assert.equal(d.remaining, 19);
    assert.equal(d.source, "failure_policy");
    assert.equal(d.shared, false);
  }
  const tiny = [];
  for (let i = 0; i < 3; i++) tiny.push(await limiter.check("alice", { limit: "tiny" }));
  assert.deepEqual(tiny.map((d) => [d.allowed, d.remaining, d.source]), [
    [true, 1, "client_fallback"], [true, 0, "client_fallback"], [false, 0, "client_fallback"],
  ]);
  assert.equal(tiny[2].retryAfterSeconds, 60);
  clock.advance(59_999);
  const last = await limiter.check("alice", { limit: "tiny" });
  assert.deepEqual([last.allowed, last.resetAfterSeconds, last.retryAfterSeconds], [false, 1, 1]);
  clock.advance(1); // the next epoch-aligned window
  const next = await limiter.check("alice", { limit: "tiny", cost: 2 });
  assert.deepEqual([next.allowed, next.remaining, next.window], [true, 0, 1_764_518_460_000 / 60_000]);
  limiter.close();
});

test("fallbackLimits decide when nothing was learned; all-or-nothing cost", async () => {
  const dead = `127.0.0.1:${await freePort()}`;
  const clock = new ManualClock(1_764_518_400_000);
  const limiter = createRateLimiter({
    address: dead, clock, logger: memoryLogger(),
    fallbackLimits: [
      { name: "mcp", requests: 5, windowSeconds: 60, isDefault: true },
      { name: "signin", requests: 5, windowSeconds: 900, onStoreFailure: "deny" },
    ],
  });
  assert.equal((await limiter.check("bob", { limit: "signin" })).allowed, false);
  const a = await limiter.check("bob", { cost: 3 });
  const b = await limiter.check("bob", { cost: 3 });
  const c = await limiter.check("bob", { cost: 2 });
  assert.deepEqual([a, b, c].map((d) => [d.allowed, d.remaining]), [[true, 2], [false, 2], [true, 0]], "a denied cost counts nothing");
  assert.equal((await limiter.peek("bob")).allowed, false, "peek: one more would not fit");
  assert.equal((await limiter.peek("bob")).remaining, 0);
  limiter.close();
});

test("a limit nobody told the client about is decided with the default limit's numbers, never unlimited, with one warning per name", async () => {
  const dead = `127.0.0.1:${await freePort()}`;
  const logger = memoryLogger();
  const limiter = createRateLimiter({ address: dead, logger, fallbackLimits: [{ name: "mcp", requests: 3, windowSeconds: 60 }] });
  const got = [];
  for (let i = 0; i < 5; i++) got.push(await limiter.check("carol", { limit: "exports" }));
  assert.deepEqual(got.map((d) => d.allowed), [true, true, true, false, false]);
  assert.ok(got.every((d) => d.limitName === "exports" && d.limit === 3 && !d.shared && d.source === "client_fallback"));
  assert.equal((await limiter.check("carol")).remaining, 2, "its own counters, not the default limit's");
  await limiter.check("carol", { limit: "other" });
  const standIn = logger.lines.filter((l) => /is not among the limits this client knows/.test(l.message));
  assert.deepEqual(standIn.map((l) => l.fields.limit), ["exports", "other"]);
  assert.match(standIn[0].message, /mcp: 3 per 60 s, local/);
  limiter.close();
});

test("maxKeys bounds the local window: the least recently used key is evicted", async () => {
  const dead = `127.0.0.1:${await freePort()}`;
  const limiter = createRateLimiter({ address: dead, maxKeys: 10, logger: memoryLogger(), fallbackLimits: [{ name: "mcp", requests: 1, windowSeconds: 3600 }] });
  assert.equal((await limiter.check("first")).allowed, true);
  assert.equal((await limiter.check("first")).allowed, false, "exhausted while remembered");
  for (let i = 0; i < 10; i++) await limiter.check(`flood-${i}`);
  assert.equal((await limiter.check("first")).allowed, true, "evicted by the flood: its count restarted");
  limiter.close();
});
