// The package's shape: CommonJS and ESM give the same API (one module instance), the
// type declarations are there, and the proto shipped inside is the repository's.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { readFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import * as esm from "@bladbase/ratelimit";
import { PACKAGE_DIR, REPO_DIR } from "./harness.mjs";

const require = createRequire(import.meta.url);

test("require() and import give the same names and the same classes", () => {
  const cjs = require("@bladbase/ratelimit");
  const names = (m) => Object.keys(m).filter((k) => k !== "default" && k !== "__esModule").sort();
  assert.deepEqual(names(esm), names(cjs));
  for (const name of ["createRateLimiter", "headers", "ManualClock", "InvalidArgumentError", "NotFoundError", "RateLimitError"]) {
    assert.equal(esm[name], cjs[name], name);
  }
  assert.equal(typeof esm.createRateLimiter, "function");
  assert.ok(new cjs.NotFoundError("x") instanceof esm.RateLimitError);
});

test("type declarations for both entry points", () => {
  const pkg = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8"));
  assert.equal(pkg.name, "@bladbase/ratelimit");
  assert.equal(pkg.engines.node, ">=20");
  for (const file of [pkg.exports["."].import.types, pkg.exports["."].require.types, pkg.exports["."].import.default, pkg.exports["."].require.default]) {
    assert.ok(existsSync(join(PACKAGE_DIR, file)), file);
  }
  const dts = readFileSync(join(PACKAGE_DIR, "dist", "types.d.ts"), "utf8");
  assert.match(dts, /"store" \| "deny_cache" \| "lease" \| "local_fallback" \| "failure_policy" \| "client_fallback"/);
});

test("the proto inside the package is the repository's, byte for byte", () => {
  const shipped = readFileSync(join(esm.PROTO_DIR, esm.PROTO_FILE));
  assert.ok(esm.PROTO_DIR.startsWith(PACKAGE_DIR));
  assert.deepEqual(shipped, readFileSync(join(REPO_DIR, "proto", esm.PROTO_FILE)), "run `npm run build` to copy it again");
});
