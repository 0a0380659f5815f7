/**
 * An Express/Connect middleware (the Rust tower layer, `src/client/layer.rs`): one
 * check per request, keyed by a function of the request.
 *
 * - allowed: the rate-limit headers are set and the next handler runs;
 * - refused: `429 Too Many Requests` with the headers and a small JSON body
 *   `{"error":"rate_limited","message":…,"limit":…,"retryAfterSeconds":…}`; the next
 *   handler does not run;
 * - the key function returns `undefined`/`null`: the request passes unlimited
 *   (deciding who is anonymous, and refusing them, is the authentication layer's job);
 * - an unusable key (empty, over 512 bytes): `400` with a JSON body, since the request
 *   carries it;
 * - any other error (an unknown limit name, a cost no window can admit) is a
 *   configuration bug: handed to `next(err)`, so the app's error handler answers it and
 *   it is found at once rather than in an outage.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { InvalidArgumentError } from "./errors";
import type { Decision } from "./types";
import type { RateLimitHeaders } from "./headers";

export interface MiddlewareOptions<Req extends IncomingMessage = IncomingMessage> {
  /** The limit's name (default: the service's default limit). */
  limit?: string;
  /** The request's key (an API token id, a user id, an IP…), or `undefined` to let it pass. */
  key: (req: Req) => string | undefined | null;
  /** Hits each request counts for (default 1). */
  cost?: number | ((req: Req) => number);
}

export type Middleware<Req extends IncomingMessage = IncomingMessage> = (
  req: Req,
  res: ServerResponse,
  next: (err?: unknown) => void,
) => void;

/** What the middleware needs of a limiter. */
interface Checker {
  check(key: string, options: { limit?: string; cost?: number }): Promise<Decision>;
  headers(decision: Decision): RateLimitHeaders;
}

export function createMiddleware<Req extends IncomingMessage>(limiter: Checker, options: MiddlewareOptions<Req>): Middleware<Req> {
  if (typeof options?.key !== "function") throw new TypeError("middleware: options.key must be a function of the request");
  return (req, res, next) => {
    let key: string | undefined | null;
    let cost: number | undefined;
    try {
      key = options.key(req);
      cost = typeof options.cost === "function" ? options.cost(req) : options.cost;
    } catch (err) {
      next(err);
      return;
    }
    if (key === undefined || key === null) {
      next();
      return;
    }
    const checkOptions: { limit?: string; cost?: number } = {};
    if (options.limit !== undefined) checkOptions.limit = options.limit;
    if (cost !== undefined) checkOptions.cost = cost;
    limiter.check(key, checkOptions).then(
      (decision) => {
        for (const [name, value] of Object.entries(limiter.headers(decision))) res.setHeader(name, value);
        if (decision.allowed) {
          next();
          return;
        }
        json(res, 429, {
          error: "rate_limited",
          message: "rate limit exceeded",
          limit: decision.limitName,
          retryAfterSeconds: decision.retryAfterSeconds ?? decision.resetAfterSeconds,
        });
      },
      (err: unknown) => {
        if (err instanceof InvalidArgumentError && err.isBadKey) {
          json(res, 400, { error: "invalid_rate_limit_key", message: err.message });
          return;
        }
        next(err);
      },
    );
  };
}

function json(res: ServerResponse, status: number, body: object): void {
  res.statusCode = status;
  res.setHeader("content-type", "application/json; charset=utf-8");
  res.end(JSON.stringify(body));
}
