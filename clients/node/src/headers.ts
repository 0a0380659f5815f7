/**
 * A decision's HTTP response headers, exactly as the Rust client renders them
 * (`src/client/headers.rs`; `tests/cases/headers.json` is checked by both test suites):
 *
 * - `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (seconds until the
 *   window ends, rounded up) on every response;
 * - `retry-after` (seconds, never less than the reset) on a refusal only;
 * - the IETF draft-10 fields `RateLimit: "mcp";r=119;t=42` and, when the window's
 *   length is known, `RateLimit-Policy: "mcp";q=120;w=60`. A limit name that is not a
 *   structured-field string (printable ASCII) drops both rather than send a malformed one.
 */
import type { Decision } from "./types";

/** Header name → value, names in lower case (as Node's `res.setHeader` accepts them). */
export interface RateLimitHeaders {
  "x-ratelimit-limit": string;
  "x-ratelimit-remaining": string;
  "x-ratelimit-reset": string;
  "retry-after"?: string;
  ratelimit?: string;
  "ratelimit-policy"?: string;
}

/** Options of {@link headers}. */
export interface HeadersOptions {
  /** The limit's window in seconds: adds `RateLimit-Policy`. */
  windowSeconds?: number;
}

const ceil = (seconds: number): number => Math.max(0, Math.ceil(seconds));

/** Seconds to wait before retrying a refusal: never less than the reset; undefined when allowed. */
export function retryAfterSeconds(decision: Decision): number | undefined {
  if (decision.allowed) return undefined;
  const reset = ceil(decision.resetAfterSeconds);
  return Math.max(ceil(decision.retryAfterSeconds ?? decision.resetAfterSeconds), reset);
}

/** The response headers for `decision` (see the module doc). */
export function headers(decision: Decision, options: HeadersOptions = {}): RateLimitHeaders {
  const reset = ceil(decision.resetAfterSeconds);
  const out: RateLimitHeaders = {
    "x-ratelimit-limit": String(decision.limit),
    "x-ratelimit-remaining": String(decision.remaining),
    "x-ratelimit-reset": String(reset),
  };
  const retry = retryAfterSeconds(decision);
  if (retry !== undefined) out["retry-after"] = String(retry);
  const name = sfString(decision.limitName);
  if (name === undefined) return out;
  if (options.windowSeconds !== undefined) {
    out["ratelimit-policy"] = `${name};q=${decision.limit};w=${ceil(options.windowSeconds)}`;
  }
  out.ratelimit = `${name};r=${decision.remaining};t=${reset}`;
  return out;
}

/** `s` as a structured-field string (RFC 9651 §3.3.3), or undefined if it has non-printable or non-ASCII characters. */
export function sfString(s: string): string | undefined {
  let out = '"';
  for (const c of s) {
    const code = c.codePointAt(0) ?? 0;
    if (code < 0x20 || code > 0x7e) return undefined;
    out += c === '"' || c === "\\" ? `\\${c}` : c;
  }
  return `${out}"`;
}
