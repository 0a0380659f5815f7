/**
 * `createRateLimiter`: how a Node service asks the rate-limit service, without ever
 * being slowed or broken by it (DESIGN §6, §12; the Rust `src/client/mod.rs`).
 *
 * `check` sends `Check` with a deadline (1.5 s by default) and answers by then whatever
 * the service does. When it is unreachable, late, failing or shedding load, the decision
 * comes from this process's own window (`window.ts`) with `shared: false`, under the
 * limit's failure policy exactly as the service applies it: `local` → the own window
 * (`source: "client_fallback"`), `allow` → admitted and `deny` → refused, counted nowhere
 * (`source: "failure_policy"`). Around the call:
 *
 * - input is validated with the service's rules and messages before any RPC; caller
 *   bugs (bad input, `INVALID_ARGUMENT`, `NOT_FOUND`) are thrown, never hidden;
 * - a breaker (`breaker.ts`) stops calling a service that keeps failing;
 * - a deny-until cache (`denyCache.ts`) refuses a refused key again with no RPC, for at
 *   most `denyCacheMs`;
 * - limits are learned from `ListLimits` once the service answers, else `fallbackLimits`
 *   (`known.ts`, which also holds the rule for a limit nobody told the client about);
 * - logging is two lines an outage (its start, its end with a count), plus one line per
 *   limit decided by the stand-in rule and one per breaker transition.
 */
import * as grpc from "@grpc/grpc-js";
import { audienceOf, IdTokens } from "./auth";
import { Breaker, type BreakerState } from "./breaker";
import { systemClock } from "./clock";
import { DenyCache } from "./denyCache";
import { ConfigError, InvalidArgumentError, NotFoundError, type RateLimitError, UnavailableError } from "./errors";
import { headers, type RateLimitHeaders } from "./headers";
import { KnownLimits } from "./known";
import { createMiddleware, type MiddlewareOptions, type Middleware } from "./middleware";
import {
  Channel,
  decisionFromPb,
  failureKind,
  limitsFromPb,
  type Method,
  parseAddress,
  type PbCheckResponse,
  type PbListLimitsResponse,
  type PendingCall,
} from "./rpc";
import type { CheckOptions, Clock, Decision, Limit, Logger, PeekOptions, RateLimiterOptions } from "./types";
import { checkCost, validateKey, validateLimitName, validateLimits, wireCost } from "./validate";
import { decisionFrom, LocalWindow, windowNumber } from "./window";
import type { IncomingMessage } from "node:http";

/** ADR-0006: a rate check waits at most 1.5 s for the service. */
export const DEFAULT_DEADLINE_MS = 1500;
/** Longest accepted deadline: a check that may take longer is not a rate check. */
const MAX_DEADLINE_MS = 3_600_000;
/** DESIGN §10: a refusal is trusted for about a second, so a Reset elsewhere is seen. */
export const DEFAULT_DENY_CACHE_MS = 1000;
export const DEFAULT_MAX_KEYS = 100_000;
/** Limit names remembered for the once-per-name stand-in warning. */
const MAX_WARNED_NAMES = 1000;
/** The service's built-in limit set. */
const BUILTIN: Limit[] = [{ name: "mcp", requests: 120, windowSeconds: 60, isDefault: true, onStoreFailure: "local" }];

type Result<T> = { ok: true; value: T } | { ok: false; caller: RateLimitError } | { ok: false; caller?: undefined; reason: string; detail: string };

const consoleLogger: Logger = {
  warn: (message, fields) => console.warn(`@bladbase/ratelimit: ${message}`, fields ?? ""),
  info: (message, fields) => console.info(`@bladbase/ratelimit: ${message}`, fields ?? ""),
};

/** Creates a limiter. Connects lazily: nothing is dialled until the first call. */
export function createRateLimiter(options: RateLimiterOptions): RateLimiter {
  return new RateLimiter(options);
}

export class RateLimiter {
  private readonly address: string;
  private readonly channel: Channel;
  private readonly breaker: Breaker;
  private readonly known: KnownLimits;
  private readonly deny: DenyCache;
  private readonly local: LocalWindow;
  private readonly clock: Clock;
  private readonly logger: Logger;
  private readonly deadlineMs: number;
  private readonly learnLimits: boolean;
  private readonly tokens: IdTokens | undefined;
  private readonly warnedNames = new Set<string>();
  /** Local decisions since the outage began; undefined while the service answers. */
  private outage: { reason: string; decisions: number } | undefined;
  private learning = false;

  constructor(options: RateLimiterOptions) {
    if (options === null || typeof options !== "object") throw new ConfigError("createRateLimiter: options must be an object");
    const where = parseAddress(options.address, options.tls);
    this.address = options.address;
    this.deadlineMs = positive("deadlineMs", options.deadlineMs ?? DEFAULT_DEADLINE_MS, MAX_DEADLINE_MS);
    const denyCacheMs = nonNegative("denyCacheMs", options.denyCacheMs ?? DEFAULT_DENY_CACHE_MS);
    const maxKeys = positive("maxKeys", options.maxKeys ?? DEFAULT_MAX_KEYS, Number.MAX_SAFE_INTEGER);
    const failures = positive("breaker.failures", options.breaker?.failures ?? 5, 1_000_000);
    const cooldownMs = nonNegative("breaker.cooldownMs", options.breaker?.cooldownMs ?? 2000);
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger ?? consoleLogger;
    this.learnLimits = options.learnLimits ?? true;
    const fallback = options.fallbackLimits === undefined ? BUILTIN : validateLimits("fallbackLimits", options.fallbackLimits);
    this.known = new KnownLimits(fallback, this.clock);
    this.deny = new DenyCache(denyCacheMs, maxKeys);
    this.local = new LocalWindow(this.clock, maxKeys);
    this.breaker = new Breaker(failures, cooldownMs, this.clock, (state, reason) => this.breakerChanged(state, reason, cooldownMs));
    this.channel = new Channel(where);
    const auth = options.cloudRunAuth;
    if (auth !== undefined && auth !== false) {
      const o = auth === true ? {} : auth;
      const scheme = where.origin.startsWith("https:") ? "https" : "http";
      this.tokens = new IdTokens(o.audience ?? audienceOf(scheme, where.origin.slice(scheme.length + 3)), o.header ?? "x-serverless-authorization");
    }
  }

  /**
   * Counts `cost` hits (default 1) for `key` under `limit` (default: the service's
   * default limit) and says whether to admit them. Resolves within `deadlineMs` whatever
   * the service does; throws only for caller bugs (bad input, unknown limit).
   */
  async check(key: string, options: CheckOptions = {}): Promise<Decision> {
    validateKey(key);
    const limit = validateLimitName(options.limit);
    const cost = wireCost(options.cost);
    const known = this.known.get(limit);
    if (known !== undefined) checkCost(known, cost);
    const cacheName = known?.name ?? limit;
    const sentMs = this.clock.now();
    const refused = this.deny.check(cacheName, key, cost, sentMs);
    if (refused !== undefined) return refused;
    const result = await this.call<PbCheckResponse>("Check", { key, limit, cost });
    if (result.ok) {
      const decision = decisionFromPb(result.value);
      this.deny.record(cacheName, key, decision, sentMs);
      return decision;
    }
    if (result.caller !== undefined) throw result.caller;
    const decider = this.localLimit(known, limit, result.reason, result.detail);
    return this.byPolicy(decider, cost) ?? this.local.decide(decider, key, cost, "client_fallback");
  }

  /**
   * `key`'s current window under `limit`, counting nothing. When the service cannot answer:
   * what a check would meet under the limit's failure policy, as the service answers it
   * (`local`: this process's window; `allow`: every hit left; `deny`: none).
   */
  async peek(key: string, options: PeekOptions = {}): Promise<Decision> {
    validateKey(key);
    const limit = validateLimitName(options.limit);
    const known = this.known.get(limit);
    const result = await this.call<PbCheckResponse>("Peek", { key, limit });
    if (result.ok) return decisionFromPb(result.value);
    if (result.caller !== undefined) throw result.caller;
    const decider = this.localLimit(known, limit, result.reason, result.detail);
    return this.byPolicy(decider, 0) ?? this.local.peek(decider, key, "client_fallback");
  }

  /** The service's limits, fetched now; the client decides with them from then on. */
  async listLimits(): Promise<Limit[]> {
    const result = await this.call<PbListLimitsResponse>("ListLimits", {});
    if (result.ok) {
      const limits = validateLimits("the service's ListLimits answer", limitsFromPb(result.value));
      this.known.learn(limits);
      return limits.map((l) => ({ ...l }));
    }
    if (result.caller !== undefined) throw result.caller;
    throw new UnavailableError(`the rate-limit service at ${this.address} could not be asked (${result.reason}): ${result.detail}`);
  }

  /** The response headers for `decision`, with `RateLimit-Policy` when the limit's window is known. */
  headers(decision: Decision): RateLimitHeaders {
    const windowSeconds = this.known.get(decision.limitName)?.windowSeconds;
    return windowSeconds === undefined ? headers(decision) : headers(decision, { windowSeconds });
  }

  /** An Express/Connect middleware: `429` + headers + a JSON body when denied, headers when allowed. */
  middleware<Req extends IncomingMessage = IncomingMessage>(options: MiddlewareOptions<Req>): Middleware<Req> {
    return createMiddleware(this, options);
  }

  /** The limits the client decides with when it must (learned, else fallback). */
  limits(): Limit[] {
    return this.known.names().flatMap((n) => {
      const l = this.known.get(n);
      return l === undefined ? [] : [{ ...l }];
    });
  }

  /** The breaker's state, for health pages and tests. */
  get breakerState(): BreakerState {
    return this.breaker.state;
  }

  /** Closes the connection. Later checks decide locally (`shared: false`) without calling. */
  close(): void {
    this.channel.close();
  }

  /**
   * The limit's `allow` or `deny` policy's decision for `cost` hits (a peek passes 0),
   * counted nowhere, as the service's; `undefined` under `local`, which decides in this
   * process's window.
   */
  private byPolicy(limit: Limit, cost: number): Decision | undefined {
    if (limit.onStoreFailure === "local") return undefined;
    const allowed = limit.onStoreFailure === "allow";
    const now = this.clock.now();
    const window = windowNumber(now, limit.windowSeconds * 1000);
    return decisionFrom(limit, now, window, allowed, allowed ? cost : limit.requests, "failure_policy");
  }

  /** The limit to decide with locally, and the outage's log line. */
  private localLimit(known: Limit | undefined, name: string, reason: string, detail: string): Limit {
    let limit = known;
    if (limit === undefined) {
      limit = this.known.standIn(name);
      if (!this.warnedNames.has(name) && this.warnedNames.size < MAX_WARNED_NAMES) {
        this.warnedNames.add(name);
        const d = this.known.defaultLimit();
        this.logger.warn(
          `limit ${JSON.stringify(name)} is not among the limits this client knows (${this.known.names().join(", ")}); while the service cannot be asked it is decided with the default limit's numbers (${d.name}: ${d.requests} per ${d.windowSeconds} s, ${d.onStoreFailure}); add it to fallbackLimits`,
          { limit: name },
        );
      }
    }
    if (reason === "closed") return limit; // the caller closed it: nothing to report
    if (this.outage === undefined) {
      this.outage = { reason, decisions: 0 };
      this.logger.warn("rate-limit service unavailable; deciding locally (shared=false)", { address: this.address, limit: limit.name, reason, error: detail });
    }
    this.outage.decisions += 1;
    return limit;
  }

  /** One RPC through the breaker, within the deadline. */
  private async call<T>(method: Method, request: object): Promise<Result<T>> {
    if (this.channel.isClosed) return { ok: false, reason: "closed", detail: "the limiter was closed" };
    const attempt = this.breaker.attempt();
    if (attempt === undefined) return { ok: false, reason: "breaker_open", detail: "circuit breaker open: the service was not called" };
    const started = performance.now();
    const generation = this.channel.generation;
    let pending: PendingCall | undefined;
    let abandoned = false;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), this.deadlineMs);
    });
    const work = (async () => {
      const metadata = new grpc.Metadata();
      if (this.tokens !== undefined) {
        try {
          metadata.set(this.tokens.header, await this.tokens.value());
        } catch (e) {
          return { noToken: e instanceof Error ? e.message : String(e) };
        }
      }
      const left = this.deadlineMs - (performance.now() - started);
      if (abandoned || left <= 0) return "late" as const;
      pending = this.channel.call(method, request, metadata, new Date(Date.now() + left));
      return pending.result;
    })();
    const outcome = await Promise.race([work, late]);
    abandoned = true;
    clearTimeout(timer);
    if (outcome === "late") {
      pending?.cancel();
      this.channel.renew(generation);
      attempt.finish(false, "late");
      return { ok: false, reason: "late", detail: `no answer within ${this.deadlineMs} ms` };
    }
    if ("noToken" in outcome) {
      attempt.finish(false, "no_token");
      return { ok: false, reason: "no_token", detail: `no ID token for the service: ${outcome.noToken}` };
    }
    if (outcome.ok) {
      attempt.finish(true, "ok");
      this.answered();
      return { ok: true, value: outcome.response as T };
    }
    const { code, details } = outcome.error;
    if (code === grpc.status.INVALID_ARGUMENT || code === grpc.status.NOT_FOUND) {
      // The service answered: it is healthy, the call is wrong.
      attempt.finish(true, "ok");
      this.answered();
      return { ok: false, caller: code === grpc.status.NOT_FOUND ? new NotFoundError(details) : new InvalidArgumentError(details, true) };
    }
    const kind = failureKind(code);
    // A fresh channel dials at once: grpc-js would otherwise wait out its reconnect
    // backoff (up to minutes) and fail the next probe without trying, holding the
    // breaker open after the service is back.
    if (kind === "late" || kind === "unavailable") this.channel.renew(generation);
    attempt.finish(false, kind);
    return { ok: false, reason: kind, detail: `${grpc.status[code] ?? code}: ${details}` };
  }

  /** The service answered: end an outage's log, and learn its limits if due. */
  private answered(): void {
    if (this.outage !== undefined) {
      this.logger.info("rate-limit service answering again; decisions are shared", {
        address: this.address,
        localDecisions: this.outage.decisions,
      });
      this.outage = undefined;
    }
    if (!this.learnLimits || this.learning || !this.known.claimRefresh()) return;
    this.learning = true;
    this.listLimits()
      .catch(() => undefined)
      .finally(() => {
        this.learning = false;
      });
  }

  private breakerChanged(state: BreakerState, reason: string, cooldownMs: number): void {
    if (state === "open") {
      this.logger.warn("service circuit breaker open: answering locally (shared=false) without calling the service", { reason, cooldownMs });
    } else if (state === "closed") {
      this.logger.info("service circuit breaker closed: decisions are shared again", { reason });
    }
  }
}

function positive(what: string, value: number, max: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0 || value > max) {
    throw new ConfigError(`${what}: must be a number above 0 and at most ${max}, got ${String(value)}`);
  }
  return value;
}

function nonNegative(what: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new ConfigError(`${what}: must be a number of at least 0, got ${String(value)}`);
  }
  return value;
}
