// ESM entry point: re-exports the CommonJS build, so `import` and `require` share one
// module instance (one set of classes: `instanceof` works across both; Node's "ES module
// wrapper" pattern). tests/package.test.mjs checks that the names match index.js.
import cjs from "./index.js";

export const {
  createRateLimiter,
  RateLimiter,
  DEFAULT_DEADLINE_MS,
  DEFAULT_DENY_CACHE_MS,
  DEFAULT_MAX_KEYS,
  headers,
  retryAfterSeconds,
  ManualClock,
  systemClock,
  RateLimitError,
  InvalidArgumentError,
  NotFoundError,
  UnavailableError,
  ConfigError,
  PROTO_DIR,
  PROTO_FILE,
  MAX_KEY_BYTES,
} = cjs;
export default cjs;
