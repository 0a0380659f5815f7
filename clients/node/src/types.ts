/**
 * The package's public shapes: decisions, limits and options. One place, so the
 * documentation, the `.d.ts` and the code agree on every name (issue 12 fixes them).
 */

/** Where a decision came from. The first five mirror the proto's `Source` values. */
export type Source =
  | "store"
  | "deny_cache"
  | "lease"
  | "local_fallback"
  | "failure_policy"
  | "client_fallback";

/** What a limit does when its counters cannot be shared (the service's `on_store_failure`). */
export type FailurePolicy = "local" | "allow" | "deny";

/** A rate decision, with everything a caller needs for its response headers. */
export interface Decision {
  /** Whether the request is admitted (its cost has been counted). */
  allowed: boolean;
  /** Requests per window (`x-ratelimit-limit`). */
  limit: number;
  /** Requests left in this window after this decision (`x-ratelimit-remaining`). */
  remaining: number;
  /** Seconds until the window ends, whole seconds rounded up (`x-ratelimit-reset`). */
  resetAfterSeconds: number;
  /** Only when denied: seconds to wait before retrying (`retry-after`). */
  retryAfterSeconds?: number;
  /**
   * True when the shared counter (every instance of every caller) decided; false when
   * one process decided alone (the service's own fallback, or this client's).
   */
  shared: boolean;
  /** Where the decision came from. */
  source: Source;
  /** The limit that decided (the default limit's name when the call named none). */
  limitName: string;
  /** The window number: `floor(unix_ms / window_ms)`. */
  window: number;
}

/** A limit as the service lists it, or as given in `fallbackLimits`. */
export interface Limit {
  /** The limit's name (`A-Z a-z 0-9 _ -`, at most 64 characters). */
  name: string;
  /** Requests admitted per window for one key (1 ..= 1,000,000,000). */
  requests: number;
  /** The window's length in whole seconds (1 s ..= 31 days). */
  windowSeconds: number;
  /** True for the limit used when a call names none. */
  isDefault: boolean;
  /** What the limit does when the service (or its store) cannot be asked. */
  onStoreFailure: FailurePolicy;
}

/** A limit as given in `fallbackLimits`: `isDefault` and `onStoreFailure` may be left out. */
export interface LimitSpec {
  name: string;
  requests: number;
  windowSeconds: number;
  /** Default: true for the first limit when none is marked. */
  isDefault?: boolean;
  /** Default: `"local"`. */
  onStoreFailure?: FailurePolicy;
}

/** The clock the client numbers its own windows and times its caches and breaker by. */
export interface Clock {
  /** Unix time in milliseconds. */
  now(): number;
}

/** When to stop calling a service that keeps failing. */
export interface BreakerOptions {
  /** Consecutive failures that open the breaker (default 5). */
  failures?: number;
  /** How long it stays open before one probe is let through, in ms (default 2000). */
  cooldownMs?: number;
}

/** Where the client's few log lines go (default: `console`). */
export interface Logger {
  warn(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
}

/** Cloud Run IAM: an ID token for the service from the metadata server on every call. */
export interface CloudRunAuthOptions {
  /** The token's audience (default: the service URL's `scheme://host[:port]`). */
  audience?: string;
  /** The metadata header the token goes in (default `x-serverless-authorization`). */
  header?: "x-serverless-authorization" | "authorization";
}

/** Settings of {@link createRateLimiter}. */
export interface RateLimiterOptions {
  /** `"127.0.0.1:50051"`, `"http://host:port"` or `"https://ratelimit-….run.app"`. */
  address: string;
  /** How long a call waits for the service before deciding locally (default 1500 ms). */
  deadlineMs?: number;
  /** TLS to the service (default: true for `https://` addresses, else false). */
  tls?: boolean;
  /**
   * Limits used until the service's own are learned (from `ListLimits`), and for limits
   * it did not list. Default: `mcp` = 120 per 60 s, the service's built-in limit.
   */
  fallbackLimits?: LimitSpec[];
  /** Breaker thresholds. */
  breaker?: BreakerOptions;
  /** Longest time a refusal by the service is repeated without asking it again (default 1000 ms). */
  denyCacheMs?: number;
  /** Send a Google ID token (Cloud Run IAM, `--no-allow-unauthenticated`). */
  cloudRunAuth?: boolean | CloudRunAuthOptions;
  /** Keys kept at most in the local window and in the deny-until cache each (default 100,000). */
  maxKeys?: number;
  /** The clock (default: the system clock); tests step a `ManualClock`. */
  clock?: Clock;
  /** Where warnings go (default: `console`). */
  logger?: Logger;
  /** Learn the service's limits from `ListLimits` after it first answers (default true). */
  learnLimits?: boolean;
}

/** Options of {@link RateLimiter.check}. */
export interface CheckOptions {
  /** A configured limit's name; empty or left out means the service's default limit. */
  limit?: string;
  /** Hits this request counts for; 0 or left out means 1. */
  cost?: number;
}

/** Options of {@link RateLimiter.peek}. */
export interface PeekOptions {
  limit?: string;
}
