/**
 * `@bladbase/ratelimit`: the Node.js client of the Bladbase rate-decision service.
 * `createRateLimiter` is the seam (see README "Node.js client"); everything exported here
 * is public API, and `index.mjs` re-exports the same names for ESM.
 */
export { createRateLimiter, RateLimiter, DEFAULT_DEADLINE_MS, DEFAULT_DENY_CACHE_MS, DEFAULT_MAX_KEYS } from "./limiter";
export { headers, retryAfterSeconds, type HeadersOptions, type RateLimitHeaders } from "./headers";
export { ManualClock, systemClock } from "./clock";
export { RateLimitError, InvalidArgumentError, NotFoundError, UnavailableError, ConfigError } from "./errors";
export type { MiddlewareOptions, Middleware } from "./middleware";
export type { BreakerState } from "./breaker";
export { PROTO_DIR, PROTO_FILE } from "./rpc";
export { MAX_KEY_BYTES } from "./validate";
export type {
  Source,
  FailurePolicy,
  Decision,
  Limit,
  LimitSpec,
  Clock,
  BreakerOptions,
  Logger,
  CloudRunAuthOptions,
  RateLimiterOptions,
  CheckOptions,
  PeekOptions,
} from "./types";
