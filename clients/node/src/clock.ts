/**
 * Injectable time. Every window number, deny-cache expiry and breaker cool-down of the
 * client is read from a {@link Clock}, so tests step a {@link ManualClock} across windows
 * instead of sleeping (the Rust side's `src/clock.rs`).
 */
import type { Clock } from "./types";

/** The system clock (`Date.now()`). */
export const systemClock: Clock = { now: () => Date.now() };

/** A clock that only moves when told to. */
export class ManualClock implements Clock {
  private ms: number;

  /** Starts at `startMs` (Unix ms; default: the system time now). */
  constructor(startMs: number = Date.now()) {
    this.ms = startMs;
  }

  now(): number {
    return this.ms;
  }

  /** Moves forward by `ms`. */
  advance(ms: number): void {
    this.ms += ms;
  }

  /** Jumps to `ms`. */
  set(ms: number): void {
    this.ms = ms;
  }
}
