// A service that takes the connection and never answers: every check returns within the
// deadline + 100 ms with shared: false, and once the breaker is open the listener sees
// no new call, connection or byte until the cool-down lets one probe through.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRateLimiter, ManualClock } from "@bladbase/ratelimit";
import { blackHole, memoryLogger, timed } from "./harness.mjs";

const DEADLINE = 400;
const settle = () => new Promise((r) => setTimeout(r, 300));

for (const mode of ["late", "silent"]) {
  test(`black hole (${mode}): deadline + 100 ms, shared: false, and no RPC once the breaker is open`, async (t) => {
    const hole = await blackHole({ mode });
    const clock = new ManualClock();
    const logger = memoryLogger();
    const limiter = createRateLimiter({ address: hole.address, deadlineMs: DEADLINE, clock, logger, breaker: { failures: 3, cooldownMs: 2000 } });
    t.after(async () => {
      limiter.close();
      await hole.close();
    });
    const key = "dave";
    for (let i = 0; i < 3; i++) {
      const { value: d, ms } = await timed(() => limiter.check(key));
      assert.ok(ms <= DEADLINE + 100, `check ${i + 1} took ${ms} ms`);
      assert.ok(ms >= DEADLINE - 50, `check ${i + 1} waited for the service (${ms} ms)`);
      assert.equal(d.shared, false);
      assert.equal(d.source, "client_fallback");
      assert.equal(d.remaining, 119 - i);
    }
    assert.equal(limiter.breakerState, "open");
    if (mode === "late") assert.equal(hole.stats.rpcs, 3, "each check was one RPC the listener took");
    await settle();
    const seen = { ...hole.stats };
    for (let i = 0; i < 20; i++) {
      const { value: d, ms } = await timed(() => limiter.check(key));
      assert.ok(ms < 100, `breaker open: answered at once (${ms} ms)`);
      assert.equal(d.shared, false);
    }
    await assert.rejects(() => limiter.listLimits(), /breaker_open/);
    await settle();
    assert.deepEqual(hole.stats, seen, "no new RPC, connection or byte while the breaker is open");
    assert.equal(logger.lines.filter((l) => /breaker open/.test(l.message)).length, 1);

    clock.advance(2000); // the cool-down: one probe goes out
    const { value: probe, ms } = await timed(() => limiter.check(key));
    assert.ok(ms <= DEADLINE + 100 && ms >= DEADLINE - 50, `the probe waited for the service (${ms} ms)`);
    assert.equal(probe.shared, false);
    assert.equal(hole.stats.connections, seen.connections + 1, "the probe dialled afresh");
    if (mode === "late") assert.equal(hole.stats.rpcs, seen.rpcs + 1, "exactly one probe");
    assert.equal(limiter.breakerState, "open", "a failed probe re-opens the breaker");
  });
}

test("concurrent checks against a black hole all return within the deadline + 100 ms", async (t) => {
  const hole = await blackHole({ mode: "late" });
  const limiter = createRateLimiter({ address: hole.address, deadlineMs: DEADLINE, logger: memoryLogger() });
  t.after(async () => {
    limiter.close();
    await hole.close();
  });
  const { value: all, ms } = await timed(() => Promise.all(Array.from({ length: 50 }, (_, i) => limiter.check(`k${i % 5}`))));
  assert.ok(ms <= DEADLINE + 100, `50 concurrent checks took ${ms} ms`);
  assert.ok(all.every((d) => !d.shared && d.source === "client_fallback" && d.allowed));
  assert.deepEqual([...new Set(all.map((d) => d.remaining))].sort((a, b) => a - b), Array.from({ length: 10 }, (_, i) => 110 + i));
});

test("the default deadline is 1500 ms: a silent service costs a check at most 1.6 s", async (t) => {
  const hole = await blackHole({ mode: "silent" });
  const limiter = createRateLimiter({ address: hole.address, logger: memoryLogger() });
  t.after(async () => {
    limiter.close();
    await hole.close();
  });
  const { value: d, ms } = await timed(() => limiter.check("jack"));
  assert.ok(ms >= 1450 && ms <= 1600, `took ${ms} ms`);
  assert.deepEqual([d.allowed, d.shared, d.source], [true, false, "client_fallback"]);
});
