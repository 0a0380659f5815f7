/**
 * The limits the client decides with when it must (the Rust `src/client/known.rs`):
 * the service's own, learned from `ListLimits`, else the `fallbackLimits` the limiter was
 * created with (default: `mcp` = 120 per 60 s, the service's built-in set).
 *
 * The client needs a limit's numbers to check `cost` before any RPC and to decide
 * locally when the service cannot answer. The service's limits win once known, since
 * the fallback limits are only the caller's guess of them.
 *
 * A limit neither knows (a name the service did not list and the fallback limits lack)
 * is, while the service cannot be asked, decided under **the default limit's requests,
 * window and failure policy**, with its own counters and its own name: never unlimited,
 * and never mixed with the default limit's counts. {@link KnownLimits.standIn} builds it.
 */
import type { Clock, Limit } from "./types";

/** How long learned limits are trusted before they are fetched again. */
export const REFRESH_EVERY_MS = 300_000;
/** Least time between two attempts to learn, so a failing `ListLimits` costs little. */
const RETRY_EVERY_MS = 30_000;

export class KnownLimits {
  private learned: { limits: Limit[]; at: number } | undefined;
  private lastAttempt: number | undefined;

  constructor(
    private readonly fallback: Limit[],
    private readonly clock: Clock,
  ) {}

  /** The limit called `name` (`""`: the default): the service's, else the fallback's. */
  get(name: string): Limit | undefined {
    return find(this.learned?.limits, name) ?? find(this.fallback, name);
  }

  /** The default limit in use: the service's once learned, else the fallback's. */
  defaultLimit(): Limit {
    const set = this.learned?.limits ?? this.fallback;
    return set.find((l) => l.isDefault) ?? set[0] ?? this.fallback[0]!;
  }

  /** The stand-in for a limit nobody told the client about (see the module doc). */
  standIn(name: string): Limit {
    const d = this.defaultLimit();
    return { ...d, name, isDefault: false };
  }

  /** Every name the client could decide for, for messages. */
  names(): string[] {
    const names = (this.learned?.limits ?? []).map((l) => l.name);
    for (const l of this.fallback) if (!names.includes(l.name)) names.push(l.name);
    return names;
  }

  learn(limits: Limit[]): void {
    this.learned = { limits, at: this.clock.now() };
  }

  /** True when the limits should be (re)learned now, and records the attempt. */
  claimRefresh(): boolean {
    const now = this.clock.now();
    if (this.learned !== undefined && now - this.learned.at < REFRESH_EVERY_MS) return false;
    if (this.lastAttempt !== undefined && now - this.lastAttempt < RETRY_EVERY_MS) return false;
    this.lastAttempt = now;
    return true;
  }
}

function find(limits: Limit[] | undefined, name: string): Limit | undefined {
  if (limits === undefined) return undefined;
  return name === "" ? limits.find((l) => l.isDefault) : limits.find((l) => l.name === name);
}
