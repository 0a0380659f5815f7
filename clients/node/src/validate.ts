/**
 * Input rules, checked before any RPC with the service's own rules and messages
 * (`src/limiter.rs`: `validate_key`, `resolve_cost`), so bad input never costs a call
 * and reads the same whether the client or the service caught it.
 */
import { ConfigError, InvalidArgumentError } from "./errors";
import type { FailurePolicy, Limit, LimitSpec } from "./types";

/** Longest accepted key, in bytes of UTF-8 (the service's `MAX_KEY_BYTES`). */
export const MAX_KEY_BYTES = 512;
/** Largest `uint32`, the proto's type for `cost` and `requests`. */
const MAX_U32 = 4_294_967_295;
/** The limits-file rules (`src/limits.rs`). */
const MAX_NAME_LEN = 64;
const MAX_REQUESTS = 1_000_000_000;
const MAX_WINDOW_SECONDS = 31 * 24 * 3600;
const NAME = /^[A-Za-z0-9_-]+$/;
const POLICIES: readonly FailurePolicy[] = ["local", "allow", "deny"];

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Throws unless `key` is a non-empty string of at most 512 bytes of UTF-8 (no lone surrogate). */
export function validateKey(key: unknown): asserts key is string {
  if (typeof key !== "string") {
    throw new InvalidArgumentError(`key: must be a string, got ${typeof key}`, false);
  }
  const bytes = Buffer.byteLength(key, "utf8");
  if (bytes === 0) throw new InvalidArgumentError("key: must not be empty", false);
  // A lone surrogate has no UTF-8 form: the service would refuse the bytes it is sent as,
  // and a local decision would count a key no service check could match.
  if (LONE_SURROGATE.test(key)) {
    throw new InvalidArgumentError("key: must be valid UTF-8, got a lone UTF-16 surrogate", false);
  }
  if (bytes > MAX_KEY_BYTES) {
    throw new InvalidArgumentError(
      `key: must be at most ${MAX_KEY_BYTES} bytes of UTF-8, got ${bytes} bytes`,
      false,
    );
  }
}

/** Throws unless `limit` is a string or left out; returns it (`""` = the default). */
export function validateLimitName(limit: unknown): string {
  if (limit === undefined || limit === null) return "";
  if (typeof limit !== "string") {
    throw new InvalidArgumentError(`limit: must be a string, got ${typeof limit}`, false);
  }
  return limit;
}

/** The cost as the proto carries it: a whole number in `0 ..= 2^32-1`, 0 meaning 1. */
export function wireCost(cost: unknown): number {
  if (cost === undefined || cost === null) return 1;
  if (typeof cost !== "number" || !Number.isInteger(cost) || cost < 0 || cost > MAX_U32) {
    throw new InvalidArgumentError(
      `cost: must be a whole number between 0 and ${MAX_U32}, got ${String(cost)}`,
      false,
    );
  }
  return Math.max(cost, 1);
}

/** Throws the service's message when `cost` can never be admitted under `limit`. */
export function checkCost(limit: Limit, cost: number): void {
  if (cost > limit.requests) {
    throw new InvalidArgumentError(
      `cost: must not exceed the ${limit.requests} requests of limit ${JSON.stringify(limit.name)}, got ${cost}`,
      false,
    );
  }
}

/**
 * A set of limits checked with the limits-file rules (fallback limits, or the service's
 * `ListLimits` answer): exactly one default, names unique. `origin` names the source.
 */
export function validateLimits(origin: string, specs: readonly LimitSpec[]): Limit[] {
  if (!Array.isArray(specs) || specs.length === 0) {
    throw new ConfigError(`${origin}: no limits; give at least one`);
  }
  const seen = new Set<string>();
  const limits = specs.map((s): Limit => {
    if (s === null || typeof s !== "object") throw new ConfigError(`${origin}: each limit must be an object, got ${String(s)}`);
    const name = String(s.name);
    const bad = (problem: string): ConfigError =>
      new ConfigError(`${origin}: limit ${JSON.stringify(name)}: ${problem}`);
    if (!NAME.test(name) || name.length > MAX_NAME_LEN) {
      throw bad(`name must be 1-${MAX_NAME_LEN} characters of A-Z a-z 0-9 _ -`);
    }
    if (seen.has(name)) throw bad("defined twice");
    seen.add(name);
    if (!Number.isInteger(s.requests) || s.requests < 1 || s.requests > MAX_REQUESTS) {
      throw bad(`requests must be between 1 and ${MAX_REQUESTS}, got ${String(s.requests)}`);
    }
    if (!Number.isInteger(s.windowSeconds) || s.windowSeconds < 1 || s.windowSeconds > MAX_WINDOW_SECONDS) {
      throw bad(`windowSeconds must be whole seconds between 1 and ${MAX_WINDOW_SECONDS}, got ${String(s.windowSeconds)}`);
    }
    const policy = s.onStoreFailure ?? "local";
    if (!POLICIES.includes(policy)) {
      throw bad(`onStoreFailure must be one of ${POLICIES.join(", ")}, got ${JSON.stringify(policy)}`);
    }
    return { name, requests: s.requests, windowSeconds: s.windowSeconds, isDefault: s.isDefault === true, onStoreFailure: policy };
  });
  const defaults = limits.filter((l) => l.isDefault);
  if (defaults.length > 1) {
    throw new ConfigError(`${origin}: several default limits (${defaults.map((l) => l.name).join(", ")}); mark exactly one`);
  }
  if (defaults.length === 0) {
    if (limits.length > 1) throw new ConfigError(`${origin}: no default limit; mark exactly one with isDefault: true`);
    limits[0]!.isDefault = true;
  }
  return limits;
}
