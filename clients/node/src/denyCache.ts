/**
 * The deny-until cache: once the service refuses a key, further checks of it are refused
 * here with no RPC, so an exhausted key costs the service (and its store) nothing.
 *
 * Trusted for at most `denyCacheMs` (default 1 s), however long the service said to
 * wait, and never into the next window (see `record`): a `Reset` sent to the service by
 * someone else (sign-in's "reset on success") is then seen within that time (DESIGN §10). While trusted, it refuses only checks whose
 * cost exceeds the `remaining` the service reported (counts only grow in a window).
 * Only the service's own refusals of the key are cached; a `deny` failure policy's
 * refusal says nothing about the key's usage.
 */
import { Lru } from "./lru";
import { counterId } from "./window";
import type { Decision } from "./types";

interface Entry {
  trustUntil: number;
  retryAt: number;
  resetAt: number;
  remaining: number;
  limit: number;
  shared: boolean;
  limitName: string;
  window: number;
}

export class DenyCache {
  private readonly entries: Lru<Entry>;

  constructor(
    private readonly trustMs: number,
    maxKeys: number,
  ) {
    this.entries = new Lru(maxKeys);
  }

  /**
   * Remembers `decision` for `(limit, key)` if it is a refusal by the service; `sentMs`:
   * when the check that got it was sent.
   *
   * A refusal holds only in its own window, and the answer says when that ends only to
   * the second: `resetAfterSeconds` is rounded up, so the window ends less than a second
   * before `decision time + resetAfterSeconds`, and never before
   * `sentMs + resetAfterSeconds − 1 s`. The refusal is trusted no longer than that, so no
   * check of the next window is ever refused here (a key refused in its window's last
   * second is not kept at all).
   */
  record(limit: string, key: string, decision: Decision, sentMs: number): void {
    const byService = ["store", "deny_cache", "local_fallback", "lease"].includes(decision.source);
    if (decision.allowed || !byService || this.trustMs <= 0) return;
    const waitMs = (decision.retryAfterSeconds ?? decision.resetAfterSeconds) * 1000;
    const trustedMs = Math.min(waitMs, this.trustMs, (decision.resetAfterSeconds - 1) * 1000);
    if (trustedMs <= 0) return;
    this.entries.set(counterId(limit, key), {
      trustUntil: sentMs + trustedMs,
      retryAt: sentMs + waitMs,
      resetAt: sentMs + decision.resetAfterSeconds * 1000,
      remaining: decision.remaining,
      limit: decision.limit,
      shared: decision.shared,
      limitName: decision.limitName,
      window: decision.window,
    });
  }

  /** A refusal of `cost` hits for `(limit, key)` at `nowMs`, while one is trusted. */
  check(limit: string, key: string, cost: number, nowMs: number): Decision | undefined {
    const id = counterId(limit, key);
    const entry = this.entries.get(id);
    if (entry === undefined) return undefined;
    if (nowMs >= entry.trustUntil) {
      this.entries.delete(id);
      return undefined;
    }
    if (cost <= entry.remaining) return undefined;
    const reset = Math.max(0, Math.ceil((entry.resetAt - nowMs) / 1000));
    return {
      allowed: false,
      limit: entry.limit,
      remaining: entry.remaining,
      resetAfterSeconds: reset,
      retryAfterSeconds: Math.max(reset, Math.ceil((entry.retryAt - nowMs) / 1000)),
      shared: entry.shared,
      source: "deny_cache",
      limitName: entry.limitName,
      window: entry.window,
    };
  }

  get size(): number {
    return this.entries.size;
  }
}
