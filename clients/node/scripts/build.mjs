// The build: ships the repository's proto inside the package (proto/), compiles the
// TypeScript (strict) to CommonJS + .d.ts in dist/, and adds the ESM entry point.
// Run by `npm run build` and by `npm pack` (prepack). Idempotent.
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const PROTO = "bladbase/ratelimit/v1/ratelimit.proto";
const repoProto = join(root, "..", "..", "proto", PROTO);
const shipped = join(root, "proto", PROTO);

if (existsSync(repoProto)) {
  mkdirSync(dirname(shipped), { recursive: true });
  copyFileSync(repoProto, shipped);
} else if (!existsSync(shipped)) {
  throw new Error(`no proto: neither ${repoProto} nor ${shipped} exists`);
}

rmSync(join(root, "dist"), { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
execFileSync(process.execPath, [tsc, "-p", join(root, "tsconfig.json")], { stdio: "inherit" });
for (const f of ["index.mjs", "index.d.mts"]) copyFileSync(join(root, "src", f), join(root, "dist", f));
process.stderr.write("built dist/ (CommonJS + ESM + .d.ts) and proto/\n");
