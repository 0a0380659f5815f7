// headers(): the shared table of cases (tests/cases/headers.json at the repository
// root), which tests/header_cases.rs checks against the Rust client too.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { headers, retryAfterSeconds, createRateLimiter } from "@bladbase/ratelimit";
import { REPO_DIR } from "./harness.mjs";

const table = JSON.parse(readFileSync(join(REPO_DIR, "tests", "cases", "headers.json"), "utf8"));

test("the table has its cases", () => assert.ok(table.cases.length >= 10));

for (const c of table.cases) {
  test(`headers: ${c.name}`, () => {
    const f = c.decision;
    const decision = {
      allowed: f.allowed,
      limit: f.limit,
      remaining: f.remaining,
      resetAfterSeconds: f.reset_after_ms / 1000,
      shared: f.shared,
      source: f.source,
      limitName: f.limit_name,
      window: f.window,
    };
    if (f.retry_after_ms !== null) decision.retryAfterSeconds = f.retry_after_ms / 1000;
    const got = c.policy_window_seconds === null ? headers(decision) : headers(decision, { windowSeconds: c.policy_window_seconds });
    assert.deepEqual(got, c.headers);
    assert.equal(retryAfterSeconds(decision), c.headers["retry-after"] === undefined ? undefined : Number(c.headers["retry-after"]));
  });
}

test("limiter.headers adds RateLimit-Policy for a limit it knows, not for one it does not", () => {
  const limiter = createRateLimiter({ address: "127.0.0.1:1", fallbackLimits: [{ name: "mcp", requests: 120, windowSeconds: 60 }] });
  const d = { allowed: true, limit: 120, remaining: 119, resetAfterSeconds: 42, shared: true, source: "store", limitName: "mcp", window: 1 };
  assert.equal(limiter.headers(d)["ratelimit-policy"], '"mcp";q=120;w=60');
  assert.equal(limiter.headers({ ...d, limitName: "other" })["ratelimit-policy"], undefined);
  limiter.close();
});
