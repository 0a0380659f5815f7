/**
 * The circuit breaker in front of the service (the Rust `src/breaker.rs`): after
 * `failures` consecutive failed calls it opens and no RPC is attempted (checks decide
 * locally at once) for `cooldownMs`; then one probe at a time goes out, and only a probe
 * that succeeds closes it again. Time is the injected clock, so tests step past the
 * cool-down instead of waiting.
 */
import type { Clock } from "./types";

export type BreakerState = "closed" | "open" | "half_open";

/** Leave to make one call; report it with {@link Attempt.finish} exactly once. */
export interface Attempt {
  readonly isProbe: boolean;
  finish(healthy: boolean, reason: string): void;
}

type Inner = { state: "closed"; failures: number } | { state: "open"; until: number } | { state: "half_open" };

export class Breaker {
  private inner: Inner = { state: "closed", failures: 0 };
  private readonly failures: number;

  constructor(
    failures: number,
    private readonly cooldownMs: number,
    private readonly clock: Clock,
    private readonly onChange: (state: BreakerState, reason: string) => void,
  ) {
    this.failures = Math.max(1, failures);
  }

  get state(): BreakerState {
    return this.inner.state;
  }

  /** Leave to call, or `undefined` while open or while a probe is out. */
  attempt(): Attempt | undefined {
    let probe = false;
    switch (this.inner.state) {
      case "half_open":
        return undefined;
      case "open":
        if (this.clock.now() < this.inner.until) return undefined;
        this.transition({ state: "half_open" }, "cool-down over");
        probe = true;
        break;
      case "closed":
        break;
    }
    let done = false;
    return {
      isProbe: probe,
      finish: (healthy: boolean, reason: string) => {
        if (done) return;
        done = true;
        this.record(probe, healthy, reason);
      },
    };
  }

  private record(probe: boolean, healthy: boolean, reason: string): void {
    const open: Inner = { state: "open", until: this.clock.now() + this.cooldownMs };
    if (probe) {
      this.transition(healthy ? { state: "closed", failures: 0 } : open, healthy ? "probe succeeded" : reason);
      return;
    }
    if (this.inner.state !== "closed") return; // a call from before the breaker opened
    if (healthy) {
      this.inner = { state: "closed", failures: 0 };
    } else if (this.inner.failures + 1 >= this.failures) {
      this.transition(open, reason);
    } else {
      this.inner = { state: "closed", failures: this.inner.failures + 1 };
    }
  }

  private transition(next: Inner, reason: string): void {
    this.inner = next;
    this.onChange(next.state, reason);
  }
}
