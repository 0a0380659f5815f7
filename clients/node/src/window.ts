/**
 * This process's own fixed windows, for when the service cannot be asked: the same
 * rules as the service's `LocalWindow` over `MemoryStore` and `store::apply_batch`.
 *
 * - Windows are aligned to the Unix epoch, `w = floor(unix_ms / window_ms)`, so the
 *   client's window numbers are the service's.
 * - All or nothing: a cost is admitted iff `count + cost ≤ requests`; a denied cost
 *   counts nothing.
 * - Windows only move forward: a counter already in a newer window than the clock says
 *   keeps counting there.
 *
 * Unlike the service's store (which keeps every live counter), the counters sit in an
 * LRU with a cap: memory stays bounded under a flood of keys, and an evicted key only
 * restarts its local count, which can admit a little more during an outage.
 */
import { Lru } from "./lru";
import type { Clock, Decision, Limit, Source } from "./types";

interface Counter {
  window: number;
  count: number;
}

/** The window number that `nowMs` falls in. */
export function windowNumber(nowMs: number, windowMs: number): number {
  return Math.floor(nowMs / Math.max(windowMs, 1));
}

/** Whole seconds (rounded up) from `nowMs` until window `w` ends; 0 if it has. */
export function secondsUntilEnd(nowMs: number, window: number, windowMs: number): number {
  return Math.max(0, Math.ceil(((window + 1) * windowMs - nowMs) / 1000));
}

/** A decision for `limit` from a counter's `count` after an `allowed` (or not) cost. */
export function decisionFrom(
  limit: Limit,
  nowMs: number,
  window: number,
  allowed: boolean,
  count: number,
  source: Source,
): Decision {
  const resetAfterSeconds = secondsUntilEnd(nowMs, window, limit.windowSeconds * 1000);
  const decision: Decision = {
    allowed,
    limit: limit.requests,
    remaining: Math.max(0, limit.requests - count),
    resetAfterSeconds,
    shared: source === "store" || source === "deny_cache" || source === "lease",
    source,
    limitName: limit.name,
    window,
  };
  if (!allowed) decision.retryAfterSeconds = resetAfterSeconds;
  return decision;
}

/** Per-(limit, key) counters of this process, numbered by the injected clock. */
export class LocalWindow {
  private readonly counters: Lru<Counter>;

  constructor(
    private readonly clock: Clock,
    maxKeys: number,
  ) {
    this.counters = new Lru(maxKeys);
  }

  /** Counts `cost` hits for `key` under `limit` in the current window. */
  decide(limit: Limit, key: string, cost: number, source: Source): Decision {
    const now = this.clock.now();
    const current = windowNumber(now, limit.windowSeconds * 1000);
    const id = counterId(limit.name, key);
    const stored = this.counters.get(id);
    const state: Counter =
      stored !== undefined && stored.window >= current ? stored : { window: current, count: 0 };
    const allowed = state.count + cost <= limit.requests;
    if (allowed) state.count += cost;
    this.counters.set(id, state);
    return decisionFrom(limit, now, state.window, allowed, state.count, source);
  }

  /** `key`'s current window under `limit`, counting nothing: allowed iff one more hit fits. */
  peek(limit: Limit, key: string, source: Source): Decision {
    const now = this.clock.now();
    const current = windowNumber(now, limit.windowSeconds * 1000);
    const stored = this.counters.get(counterId(limit.name, key));
    const state = stored !== undefined && stored.window >= current ? stored : { window: current, count: 0 };
    return decisionFrom(limit, now, state.window, state.count < limit.requests, state.count, source);
  }

  /** Counters held (for tests and health pages). */
  get size(): number {
    return this.counters.size;
  }

  /** Counters evicted by the cap. */
  get evicted(): number {
    return this.counters.evicted;
  }
}

/** One string per (limit, key); NUL cannot occur in a limit name. */
export function counterId(limit: string, key: string): string {
  return `${limit}\u0000${key}`;
}
