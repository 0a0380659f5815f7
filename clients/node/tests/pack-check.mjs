// The packed tarball, as a user gets it: `npm pack`, install it into an empty project,
// then run the README's Node example as written (extracted from README.md), require()
// it from CommonJS, type-check a strict TypeScript consumer against its .d.ts, and run
// the Express example from the installed package. Run by `npm run pack-check`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRequire } from "node:module";
import { startService, PACKAGE_DIR, REPO_DIR } from "./harness.mjs";

const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (cmd, args, opts = {}) => execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], ...opts });
let dir;
let tarball;
let service;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "rl-pack-"));
  const out = run(npm, ["pack", "--json", "--pack-destination", dir, "--loglevel=error"], { cwd: PACKAGE_DIR });
  const packed = JSON.parse(out.slice(out.search(/^\[/m))); // after the prepack script's lines
  tarball = packed[0];
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "pack-check", version: "1.0.0", private: true }));
  const devDeps = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8")).devDependencies;
  run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error", join(dir, tarball.filename),
    `express@${devDeps.express}`, `@types/node@${devDeps["@types/node"]}`], { cwd: dir });
  service = await startService();
});
after(async () => {
  await service?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("the tarball holds the build, the types, the proto and the examples, not the sources", () => {
  const files = tarball.files.map((f) => f.path).sort();
  for (const f of ["dist/index.js", "dist/index.mjs", "dist/index.d.ts", "dist/index.d.mts", "proto/bladbase/ratelimit/v1/ratelimit.proto", "examples/express.mjs", "package.json", "README.md"]) {
    assert.ok(files.includes(f), `${f} in ${files.join(", ")}`);
  }
  assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("tests/") || f.startsWith("node_modules/")), files.join(", "));
});

test("the README's Node example runs as written from the installed tarball", () => {
  const readme = readFileSync(join(REPO_DIR, "README.md"), "utf8");
  const m = /<!-- node-readme-example[^>]*-->\s*```js\n([\s\S]*?)```/.exec(readme);
  assert.ok(m, "README.md has the marked Node example");
  writeFileSync(join(dir, "example.mjs"), m[1]);
  const out = run(process.execPath, ["example.mjs"], { cwd: dir, env: { ...process.env, RATELIMIT_ADDRESS: service.address } });
  const [first, ...rest] = out.trim().split("\n");
  assert.equal(first, "true 119 true store");
  const printed = rest.join("\n");
  assert.match(printed, /'x-ratelimit-limit': '120'/);
  assert.match(printed, /'x-ratelimit-remaining': '119'/);
  assert.match(printed, /ratelimit: '"mcp";r=119;t=\d+'/);
});

test("require() works from a CommonJS project", () => {
  const out = run(process.execPath, ["-e", "const r = require('@bladbase/ratelimit'); const l = r.createRateLimiter({ address: '127.0.0.1:1' }); console.log(typeof r.headers, l.breakerState); l.close();"], { cwd: dir });
  assert.equal(out.trim(), "function closed");
});

test("a strict TypeScript consumer type-checks against the .d.ts (ESM and CommonJS)", () => {
  const code = `import { createRateLimiter, headers, ManualClock, InvalidArgumentError, type Decision, type Source } from "@bladbase/ratelimit";
const limiter = createRateLimiter({ address: "127.0.0.1:1", deadlineMs: 200, clock: new ManualClock(), fallbackLimits: [{ name: "mcp", requests: 1, windowSeconds: 60, onStoreFailure: "deny" }] });
export async function f(): Promise<string> {
  const d: Decision = await limiter.check("k", { limit: "mcp", cost: 1 });
  const s: Source = d.source;
  const h: string | undefined = headers(d)["retry-after"];
  const e = new InvalidArgumentError("key: x", false);
  return s + (h ?? "") + String(d.retryAfterSeconds ?? 0) + String(e.isBadKey);
}
`;
  writeFileSync(join(dir, "consumer.mts"), code);
  writeFileSync(join(dir, "consumer.cts"), code);
  const tsc = createRequire(join(PACKAGE_DIR, "package.json")).resolve("typescript/bin/tsc");
  run(process.execPath, [tsc, "--noEmit", "--strict", "--module", "node16", "--moduleResolution", "node16", "--target", "es2022", "--types", "node", "--skipLibCheck", "consumer.mts", "consumer.cts"], { cwd: dir });
});

test("the Express example runs from the installed package", async (t) => {
  const child = spawn(process.execPath, [join(dir, "node_modules", "@bladbase", "ratelimit", "examples", "express.mjs")], {
    cwd: dir,
    env: { ...process.env, RATELIMIT_ADDRESS: service.address, PORT: "0" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => child.kill("SIGKILL"));
  let out = "";
  const url = await new Promise((resolve, reject) => {
    child.stdout.on("data", (b) => {
      out += b;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`example exited ${code}: ${out}`)));
  });
  const r = await fetch(url, { headers: { "x-api-token": `packed-${process.pid}` } });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get("x-ratelimit-remaining"), "119");
});
