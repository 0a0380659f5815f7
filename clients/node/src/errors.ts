/**
 * The client's errors: caller bugs and configuration mistakes only. A service that is
 * unreachable, late, failing or shedding load is never an error of `check`/`peek`:
 * those calls then decide locally (`shared: false`).
 */

/** Base class of every error this package throws; `code` is stable for programs. */
export class RateLimitError extends Error {
  readonly code: string;

  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    this.name = new.target.name;
  }
}

/**
 * Bad input: a bad key or cost (found before any RPC, with the service's own message),
 * or the service's `INVALID_ARGUMENT` (e.g. a cost above a limit the client did not know).
 */
export class InvalidArgumentError extends RateLimitError {
  /** True when the service said so; false when caught here before any RPC. */
  readonly fromService: boolean;
  /** The field at fault (`key`, `cost`, `limit`), when known. */
  readonly field: string | undefined;

  constructor(message: string, fromService: boolean) {
    super("INVALID_ARGUMENT", message);
    this.fromService = fromService;
    const field = /^(\w+):/.exec(message)?.[1];
    this.field = field;
  }

  /** True when the key itself is unusable (the request being limited is at fault). */
  get isBadKey(): boolean {
    return this.field === "key";
  }
}

/** The service has no limit by that name (`NOT_FOUND`); the message lists the known ones. */
export class NotFoundError extends RateLimitError {
  constructor(message: string) {
    super("NOT_FOUND", message);
  }
}

/** The service could not be asked, for a call that has no local answer (`listLimits`). */
export class UnavailableError extends RateLimitError {
  constructor(message: string) {
    super("UNAVAILABLE", message);
  }
}

/** A `createRateLimiter` option is unusable. */
export class ConfigError extends RateLimitError {
  constructor(message: string) {
    super("CONFIG", message);
  }
}
