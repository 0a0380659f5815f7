// The pieces without a network: window arithmetic and the all-or-nothing rule, the LRU
// cap, the breaker, the deny cache's trust bound, address and option checks, and the
// wire mapping of sources.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ManualClock, createRateLimiter, ConfigError } from "@bladbase/ratelimit";
import { LocalWindow, windowNumber, secondsUntilEnd } from "../dist/window.js";
import { Lru } from "../dist/lru.js";
import { Breaker } from "../dist/breaker.js";
import { DenyCache } from "../dist/denyCache.js";
import { parseAddress, sourceFromPb, secondsFromPb, decisionFromPb } from "../dist/rpc.js";

const limit = (requests, windowSeconds, name = "t") => ({ name, requests, windowSeconds, isDefault: true, onStoreFailure: "local" });

test("window number is floor(unix_ms / window_ms), as the service's window.rs", () => {
  assert.equal(windowNumber(0, 60_000), 0);
  assert.equal(windowNumber(59_999, 60_000), 0);
  assert.equal(windowNumber(60_000, 60_000), 1);
  assert.equal(windowNumber(1_764_518_400_123, 60_000), 29_408_640);
  assert.equal(secondsUntilEnd(60_500, 1, 60_000), 60);
  assert.equal(secondsUntilEnd(119_001, 1, 60_000), 1);
  assert.equal(secondsUntilEnd(500_000, 1, 60_000), 0);
});

test("local window: all or nothing, epoch-aligned, windows only move forward", () => {
  const clock = new ManualClock(120_000 - 1);
  const w = new LocalWindow(clock, 100);
  const l = limit(5, 60);
  assert.deepEqual([w.decide(l, "k", 3, "client_fallback").allowed, w.decide(l, "k", 3, "client_fallback").allowed], [true, false]);
  const fits = w.decide(l, "k", 2, "client_fallback");
  assert.deepEqual([fits.allowed, fits.remaining, fits.window, fits.resetAfterSeconds, fits.shared], [true, 0, 1, 1, false]);
  const refused = w.decide(l, "k", 1, "client_fallback");
  assert.deepEqual([refused.allowed, refused.retryAfterSeconds], [false, 1]);
  clock.advance(1);
  const fresh = w.decide(l, "k", 5, "client_fallback");
  assert.deepEqual([fresh.allowed, fresh.remaining, fresh.window, fresh.resetAfterSeconds], [true, 0, 2, 60]);
  clock.set(60_000); // a clock stepped back: the newer window keeps counting
  const back = w.decide(l, "k", 1, "client_fallback");
  assert.deepEqual([back.allowed, back.window], [false, 2]);
  assert.deepEqual([w.peek(l, "k", "client_fallback").allowed, w.peek(l, "other", "client_fallback").remaining], [false, 5]);
});

test("memory is bounded: an LRU with a cap", () => {
  const lru = new Lru(3);
  for (const k of ["a", "b", "c"]) lru.set(k, k);
  lru.get("a"); // a is now the most recent
  lru.set("d", "d");
  assert.deepEqual([lru.get("b"), lru.get("a"), lru.size, lru.evicted], [undefined, "a", 3, 1]);
  const w = new LocalWindow(new ManualClock(0), 1000);
  for (let i = 0; i < 5000; i++) w.decide(limit(10, 60), `key-${i}`, 1, "client_fallback");
  assert.deepEqual([w.size, w.evicted], [1000, 4000]);
});

test("breaker: opens after N consecutive failures, one probe after the cool-down, closes only on a good probe", () => {
  const clock = new ManualClock(0);
  const changes = [];
  const b = new Breaker(3, 1000, clock, (s) => changes.push(s));
  b.attempt().finish(false, "late");
  b.attempt().finish(false, "late");
  b.attempt().finish(true, "ok"); // a success resets the streak
  for (let i = 0; i < 3; i++) b.attempt().finish(false, "late");
  assert.equal(b.state, "open");
  assert.equal(b.attempt(), undefined);
  clock.advance(999);
  assert.equal(b.attempt(), undefined);
  clock.advance(1);
  const probe = b.attempt();
  assert.equal(probe.isProbe, true);
  assert.equal(b.attempt(), undefined, "one probe at a time");
  probe.finish(false, "late");
  assert.equal(b.state, "open");
  clock.advance(1000);
  const good = b.attempt();
  good.finish(true, "ok");
  good.finish(false, "late"); // reported twice: only the first counts
  assert.equal(b.state, "closed");
  assert.deepEqual(changes, ["open", "half_open", "open", "half_open", "closed"]);
});

test("deny cache: refuses while trusted and only costs that cannot fit; trust is capped", () => {
  const c = new DenyCache(1000, 100);
  const refusal = { allowed: false, limit: 3, remaining: 1, resetAfterSeconds: 50, retryAfterSeconds: 50, shared: true, source: "store", limitName: "t", window: 7 };
  c.record("t", "k", refusal, 10_000);
  assert.equal(c.check("t", "k", 1, 10_000), undefined, "cost 1 may still fit");
  const hit = c.check("t", "k", 2, 10_400);
  assert.deepEqual([hit.source, hit.allowed, hit.retryAfterSeconds, hit.resetAfterSeconds, hit.shared], ["deny_cache", false, 50, 50, true]);
  assert.equal(c.check("t", "k", 2, 11_000), undefined, "trusted for 1000 ms, not the 50 s");
  for (const source of ["failure_policy", "client_fallback"]) {
    c.record("t", source, { ...refusal, source, remaining: 0 }, 0);
    assert.equal(c.check("t", source, 1, 0), undefined, `${source} refusals are not cached`);
  }
  const off = new DenyCache(0, 100);
  off.record("t", "k", refusal, 0);
  assert.equal(off.check("t", "k", 3, 0), undefined, "denyCacheMs 0 turns it off");
});

test("deny cache: a refusal is never trusted into the next window", () => {
  // Refused 1.7 s into a 2 s window: the service says 1 s (0.3 s, rounded up).
  const late = { allowed: false, limit: 3, remaining: 0, resetAfterSeconds: 1, retryAfterSeconds: 1, shared: true, source: "store", limitName: "tiny", window: 7 };
  const c = new DenyCache(1000, 100);
  c.record("tiny", "k", late, 1_700);
  assert.equal(c.check("tiny", "k", 1, 1_701), undefined, "its window ends within the second: not kept");
  // With 2 s (1.1 to 2 s left), trusted for at most 1 s from when the check was sent.
  const early = { ...late, resetAfterSeconds: 2, retryAfterSeconds: 2 };
  const long = new DenyCache(5000, 100);
  long.record("tiny", "k", early, 1_000);
  assert.notEqual(long.check("tiny", "k", 1, 1_999), undefined);
  assert.equal(long.check("tiny", "k", 1, 2_000), undefined);
});

test("addresses and options are checked when the limiter is created", () => {
  assert.deepEqual(parseAddress("127.0.0.1:50051"), { target: "127.0.0.1:50051", tls: false, origin: "http://127.0.0.1:50051" });
  assert.deepEqual(parseAddress("https://ratelimit-abc-ew.a.run.app/x"), { target: "ratelimit-abc-ew.a.run.app:443", tls: true, origin: "https://ratelimit-abc-ew.a.run.app" });
  assert.deepEqual(parseAddress("http://[::1]:9"), { target: "[::1]:9", tls: false, origin: "http://[::1]:9" });
  assert.equal(parseAddress("svc:8443", true).tls, true);
  for (const bad of ["", "no-port", "ftp://x:1", "http://", "a b:1", 42, "host:1/path"]) {
    assert.throws(() => createRateLimiter({ address: bad }), ConfigError, String(bad));
  }
  for (const opts of [{ deadlineMs: 0 }, { deadlineMs: -5 }, { deadlineMs: Infinity }, { denyCacheMs: -1 }, { maxKeys: 0 }, { breaker: { failures: 0 } },
    { fallbackLimits: [] }, { fallbackLimits: [{ name: "a b", requests: 1, windowSeconds: 1 }] }, { fallbackLimits: [{ name: "a", requests: 0, windowSeconds: 1 }] },
    { fallbackLimits: [{ name: "a", requests: 1, windowSeconds: 0.5 }] }, { fallbackLimits: [{ name: "a", requests: 1, windowSeconds: 1, onStoreFailure: "maybe" }] },
    { fallbackLimits: [{ name: "a", requests: 1, windowSeconds: 1 }, { name: "b", requests: 1, windowSeconds: 1 }] }]) {
    assert.throws(() => createRateLimiter({ address: "127.0.0.1:1", ...opts }), ConfigError, JSON.stringify(opts));
  }
  assert.throws(() => createRateLimiter({ address: "127.0.0.1:1", fallbackLimits: [{ name: "a", requests: 0, windowSeconds: 1 }] }), {
    message: 'fallbackLimits: limit "a": requests must be between 1 and 1000000000, got 0',
  });
});

test("wire mapping: proto Source names map generically, unknown ones by shared; durations round up", () => {
  assert.deepEqual(
    ["SOURCE_STORE", "SOURCE_DENY_CACHE", "SOURCE_LOCAL_FALLBACK", "SOURCE_FAILURE_POLICY", "SOURCE_LEASE"].map((s) => sourceFromPb(s, true)),
    ["store", "deny_cache", "local_fallback", "failure_policy", "lease"],
  );
  assert.deepEqual([sourceFromPb("SOURCE_UNSPECIFIED", true), sourceFromPb(99, false), sourceFromPb("SOURCE_FUTURE", true)], ["store", "local_fallback", "store"]);
  assert.deepEqual([secondsFromPb({ seconds: "41", nanos: 1 }), secondsFromPb(null), secondsFromPb({ seconds: "-3", nanos: 0 })], [42, 0, 0]);
  const d = decisionFromPb({ allowed: false, limit: 5, remaining: 0, reset_after: { seconds: "42", nanos: 0 }, retry_after: null, shared: true, source: "SOURCE_LEASE", limit_name: "signin", window: "7" });
  assert.deepEqual(d, { allowed: false, limit: 5, remaining: 0, resetAfterSeconds: 42, retryAfterSeconds: 42, shared: true, source: "lease", limitName: "signin", window: 7 });
});
