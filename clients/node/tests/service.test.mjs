// The client against the real `ratelimit` binary on loopback, through a counting
// front door (so "no RPC" is counted, not assumed).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { createRateLimiter, ManualClock, InvalidArgumentError, NotFoundError, PROTO_DIR, PROTO_FILE } from "@bladbase/ratelimit";
import { startService, frontDoor, memoryLogger } from "./harness.mjs";

const LIMITS = `
[[limit]]
name = "mcp"
requests = 120
window = "1day"
default = true

[[limit]]
name = "signin"
requests = 3
window = "1day"
on_store_failure = "deny"
`;
const ADMIN = "admin-token-for-tests";
let service;
let door;

before(async () => {
  service = await startService({ limits: LIMITS, adminToken: ADMIN });
  door = await frontDoor({ upstream: service.address });
});
after(async () => {
  await door.close();
  await service.stop();
});

const unique = (what) => `${what}-${process.pid}-${Math.random().toString(36).slice(2)}`;
const checks = () => door.calls.Check ?? 0;

test("125 checks: 120 admitted by the store, the 121st denied with retryAfterSeconds, the rest from the deny cache with no RPC", async () => {
  const limiter = createRateLimiter({ address: door.address, learnLimits: false });
  const key = unique("burst");
  const before = checks();
  const decisions = [];
  for (let i = 0; i < 125; i++) decisions.push(await limiter.check(key));
  const admitted = decisions.filter((d) => d.allowed);
  assert.equal(admitted.length, 120);
  assert.deepEqual(admitted.map((d) => d.remaining), Array.from({ length: 120 }, (_, i) => 119 - i));
  assert.ok(decisions.slice(0, 120).every((d) => d.allowed && d.shared && d.source === "store" && d.limitName === "mcp" && d.limit === 120));
  assert.equal(new Set(decisions.map((d) => d.window)).size, 1, "one window");
  assert.equal(decisions[0].window, Math.floor(Date.now() / 86_400_000));
  const denied = decisions[120];
  assert.equal(denied.allowed, false);
  assert.equal(denied.source, "store");
  assert.equal(denied.shared, true);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfterSeconds >= 1 && denied.retryAfterSeconds <= 86_400, `retryAfterSeconds ${denied.retryAfterSeconds}`);
  assert.equal(decisions[0].retryAfterSeconds, undefined, "no retryAfterSeconds when allowed");
  for (const d of decisions.slice(121)) {
    assert.equal(d.allowed, false);
    assert.equal(d.source, "deny_cache");
    assert.ok(d.retryAfterSeconds >= 1);
  }
  assert.equal(checks() - before, 121, "the deny cache answered the last 4 with no RPC");
  limiter.close();
});

test("the deny cache is trusted for at most denyCacheMs: a Reset elsewhere is seen within it", async () => {
  const clock = new ManualClock();
  const limiter = createRateLimiter({ address: door.address, clock, denyCacheMs: 1000, learnLimits: false });
  const key = unique("signin");
  for (let i = 0; i < 3; i++) assert.equal((await limiter.check(key, { limit: "signin" })).allowed, true);
  const refused = await limiter.check(key, { limit: "signin" });
  assert.equal(refused.source, "store");
  assert.equal(refused.allowed, false);
  const before = checks();
  clock.advance(999);
  const cached = await limiter.check(key, { limit: "signin" });
  assert.equal(cached.source, "deny_cache");
  assert.equal(checks(), before, "no RPC while trusted");

  // Sign-in succeeded elsewhere: an admin resets the key at the service.
  const def = protoLoader.loadSync(PROTO_FILE, { includeDirs: [PROTO_DIR], keepCase: true });
  const { RateLimiter } = grpc.loadPackageDefinition(def).bladbase.ratelimit.v1;
  const raw = new RateLimiter(service.address, grpc.credentials.createInsecure());
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${ADMIN}`);
  await new Promise((res, rej) => raw.Reset({ key, limit: "signin" }, md, { deadline: Date.now() + 2000 }, (e, r) => (e ? rej(e) : res(r))));
  raw.close();

  clock.advance(1);
  const after = await limiter.check(key, { limit: "signin" });
  assert.equal(checks(), before + 1, "asked the service again after denyCacheMs");
  assert.equal(after.allowed, true);
  assert.equal(after.shared, true);
  assert.equal(after.remaining, 2);
  limiter.close();
});

test("caller bugs are thrown as typed errors; bad input costs no RPC and never opens the breaker", async () => {
  const limiter = createRateLimiter({ address: door.address, learnLimits: false, breaker: { failures: 2 } });
  const before = checks();
  const local = [
    [() => limiter.check(""), "key: must not be empty"],
    [() => limiter.check("k".repeat(513)), "key: must be at most 512 bytes of UTF-8, got 513 bytes"],
    [() => limiter.check("é".repeat(257)), "key: must be at most 512 bytes of UTF-8, got 514 bytes"],
    [() => limiter.check("k", { cost: -1 }), "cost: must be a whole number between 0 and 4294967295, got -1"],
    [() => limiter.check("k", { cost: 1.5 }), "cost: must be a whole number between 0 and 4294967295, got 1.5"],
    [() => limiter.check("k", { cost: 121 }), 'cost: must not exceed the 120 requests of limit "mcp", got 121'],
    [() => limiter.check(42), "key: must be a string, got number"],
    [() => limiter.check("bad\uD800"), "key: must be valid UTF-8, got a lone UTF-16 surrogate"],
    [() => limiter.check("\uDC00bad"), "key: must be valid UTF-8, got a lone UTF-16 surrogate"],
    [() => limiter.peek(""), "key: must not be empty"],
  ];
  for (const [call, message] of local) {
    await assert.rejects(call, (e) => e instanceof InvalidArgumentError && e.fromService === false && e.message === message);
  }
  assert.equal(checks(), before, "no RPC for bad input");
  // A well-formed pair is one character, not a lone surrogate.
  assert.equal((await limiter.check(unique("ok\uD83D\uDE00"))).allowed, true);

  for (let i = 0; i < 3; i++) {
    await assert.rejects(
      () => limiter.check("k", { limit: "nope" }),
      (e) => e instanceof NotFoundError && e.code === "NOT_FOUND" && e.message === 'unknown limit "nope"; known limits: mcp, signin',
    );
  }
  // signin is known only to the service here: the service checks the cost.
  await assert.rejects(
    () => limiter.check("k", { limit: "signin", cost: 5 }),
    (e) => e instanceof InvalidArgumentError && e.fromService === true && e.message === 'cost: must not exceed the 3 requests of limit "signin", got 5',
  );
  assert.equal(checks(), before + 5, "the emoji key, three unknown limits, the service-checked cost");
  assert.equal(limiter.breakerState, "closed", "an answered error is a healthy service");
  limiter.close();
});

test("peek counts nothing; listLimits returns the service's limits and the client checks costs with them", async () => {
  const logger = memoryLogger();
  const limiter = createRateLimiter({ address: door.address, learnLimits: false, logger });
  const key = unique("peek");
  const first = await limiter.check(key, { cost: 5 });
  assert.equal(first.remaining, 115);
  const peeked = await limiter.peek(key);
  assert.deepEqual({ ...peeked, resetAfterSeconds: 0 }, { ...first, resetAfterSeconds: 0 });
  assert.equal((await limiter.peek(key)).remaining, 115, "peeking twice counts nothing");

  const limits = await limiter.listLimits();
  assert.deepEqual(limits, [
    { name: "mcp", requests: 120, windowSeconds: 86_400, isDefault: true, onStoreFailure: "local" },
    { name: "signin", requests: 3, windowSeconds: 86_400, isDefault: false, onStoreFailure: "deny" },
  ]);
  const before = checks();
  await assert.rejects(() => limiter.check(key, { limit: "signin", cost: 4 }), (e) => e instanceof InvalidArgumentError && !e.fromService);
  assert.equal(checks(), before, "learned limits catch the bad cost before any RPC");
  const h = limiter.headers(first);
  assert.equal(h["ratelimit-policy"], '"mcp";q=120;w=86400');
  assert.deepEqual(logger.lines, [], "nothing to warn about");
  limiter.close();
});

test("limits are learned in the background after the service first answers", async () => {
  const limiter = createRateLimiter({ address: door.address });
  const before = door.calls.ListLimits ?? 0;
  await limiter.check(unique("learn"));
  for (let i = 0; i < 100 && limiter.limits().length < 2; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal((door.calls.ListLimits ?? 0) - before, 1, "one ListLimits");
  assert.deepEqual(limiter.limits().map((l) => `${l.name}:${l.requests}/${l.windowSeconds}:${l.onStoreFailure}`), ["mcp:120/86400:local", "signin:3/86400:deny"]);
  await limiter.check(unique("learn"));
  assert.equal((door.calls.ListLimits ?? 0) - before, 1, "not again while fresh");
  limiter.close();
});

test("after close() checks decide locally with no RPC", async () => {
  const logger = memoryLogger();
  const limiter = createRateLimiter({ address: door.address, learnLimits: false, logger });
  const key = unique("closed");
  assert.equal((await limiter.check(key)).shared, true);
  limiter.close();
  const before = checks();
  const d = await limiter.check(key);
  assert.deepEqual([d.allowed, d.shared, d.source, d.remaining], [true, false, "client_fallback", 119]);
  assert.equal(checks(), before);
  assert.deepEqual(logger.lines, [], "closing is not an outage");
});
