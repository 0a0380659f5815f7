// A service that answers with a failure (shedding load, internal errors, draining):
// local decisions, counted toward the breaker; an answered caller error is not.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { createRateLimiter, InvalidArgumentError, ManualClock, NotFoundError } from "@bladbase/ratelimit";
import { startService, frontDoor, memoryLogger } from "./harness.mjs";

let service;
let door;
let failWith; // the gRPC status the front door answers with, or undefined to forward
before(async () => {
  service = await startService();
  door = await frontDoor({ upstream: service.address, gate: () => failWith });
});
after(async () => {
  await door.close();
  await service.stop();
});

for (const [name, code] of [
  ["shedding (RESOURCE_EXHAUSTED)", grpc.status.RESOURCE_EXHAUSTED],
  ["failing (INTERNAL)", grpc.status.INTERNAL],
  ["draining (UNAVAILABLE)", grpc.status.UNAVAILABLE],
]) {
  test(`a ${name} service: local decisions, and the breaker opens after 2 of them`, async (t) => {
    const clock = new ManualClock();
    const limiter = createRateLimiter({ address: door.address, clock, learnLimits: false, logger: memoryLogger(), breaker: { failures: 2, cooldownMs: 1000 } });
    t.after(() => limiter.close());
    failWith = { code, message: "no capacity" };
    const before = door.calls.Check ?? 0;
    const key = `erin-${code}`;
    for (let i = 0; i < 5; i++) {
      const d = await limiter.check(key);
      assert.deepEqual([d.allowed, d.shared, d.source, d.remaining], [true, false, "client_fallback", 119 - i]);
    }
    assert.equal((door.calls.Check ?? 0) - before, 2, "no RPC after the breaker opened");
    failWith = undefined;
    clock.advance(1000);
    const probe = await limiter.check(key);
    assert.deepEqual([probe.shared, probe.source, probe.remaining], [true, "store", 119], "the probe succeeded: shared again");
    assert.equal(limiter.breakerState, "closed");
    assert.equal((door.calls.Check ?? 0) - before, 3);
  });
}

test("NOT_FOUND and INVALID_ARGUMENT from the service are thrown, and count as a healthy service", async (t) => {
  const limiter = createRateLimiter({ address: door.address, learnLimits: false, logger: memoryLogger(), breaker: { failures: 1 } });
  t.after(() => {
    failWith = undefined;
    limiter.close();
  });
  failWith = { code: grpc.status.NOT_FOUND, message: 'unknown limit "x"; known limits: mcp' };
  await assert.rejects(() => limiter.check("k", { limit: "x" }), (e) => e instanceof NotFoundError && e.message === 'unknown limit "x"; known limits: mcp');
  await assert.rejects(() => limiter.peek("k", { limit: "x" }), NotFoundError);
  failWith = { code: grpc.status.INVALID_ARGUMENT, message: "cost: must not exceed the 3 requests of limit \"x\", got 5" };
  await assert.rejects(
    () => limiter.check("k", { limit: "x", cost: 5 }),
    (e) => e instanceof InvalidArgumentError && e.fromService && e.field === "cost" && !e.isBadKey && e.message === 'cost: must not exceed the 3 requests of limit "x", got 5',
  );
  assert.equal(limiter.breakerState, "closed");
});
