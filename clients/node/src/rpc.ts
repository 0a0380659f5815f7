/**
 * The wire: the proto shipped in this package (`proto/`, copied from the repository's
 * `proto/` by the build), loaded with `@grpc/proto-loader` into a `@grpc/grpc-js`
 * client, and the mapping of its messages to this package's shapes.
 *
 * The channel connects lazily and is replaced after a call runs into the deadline
 * (as the Rust client renews its connection): a late answer may mean a dead connection,
 * or one whose peer never finished the HTTP/2 handshake, that would otherwise keep
 * every call late; closing it also stops any connection attempt in the background,
 * so an open breaker really means no traffic to the service.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as path from "node:path";
import { ConfigError } from "./errors";
import type { Decision, FailurePolicy, LimitSpec, Source } from "./types";

/** Where the proto files sit inside the package. */
export const PROTO_DIR = path.join(__dirname, "..", "proto");
export const PROTO_FILE = "bladbase/ratelimit/v1/ratelimit.proto";

interface PbDuration {
  seconds: string | number;
  nanos: number;
}

export interface PbCheckResponse {
  allowed: boolean;
  limit: number;
  remaining: number;
  reset_after: PbDuration | null;
  retry_after: PbDuration | null;
  shared: boolean;
  source: string | number;
  limit_name: string;
  window: string | number;
}

export interface PbListLimitsResponse {
  limits: {
    name: string;
    requests: number;
    window: PbDuration | null;
    is_default: boolean;
    on_store_failure: string;
  }[];
}

type Callback = (err: grpc.ServiceError | null, response?: unknown) => void;
type UnaryMethod = (
  request: object,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: Callback,
) => grpc.ClientUnaryCall;
export type Method = "Check" | "Peek" | "ListLimits";
type ServiceClient = grpc.Client & Record<Method, UnaryMethod>;
type ServiceClientCtor = new (target: string, credentials: grpc.ChannelCredentials, options?: grpc.ChannelOptions) => ServiceClient;

let ctor: ServiceClientCtor | undefined;

/** The generated client class (the proto is parsed once per process). */
function serviceClient(): ServiceClientCtor {
  if (ctor !== undefined) return ctor;
  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    bladbase: { ratelimit: { v1: { RateLimiter: ServiceClientCtor } } };
  };
  ctor = pkg.bladbase.ratelimit.v1.RateLimiter;
  return ctor;
}

/** Where and how to reach the service, from `address` and `tls`. */
export interface Target {
  /** `host:port` for grpc-js. */
  target: string;
  tls: boolean;
  /** `scheme://host[:port]`, the Cloud Run ID-token audience. */
  origin: string;
}

/** Parses `"host:port"`, `"http://host:port"` or `"https://host[:port]"`. */
export function parseAddress(address: unknown, tls: boolean | undefined): Target {
  const bad = (why: string): ConfigError =>
    new ConfigError(`address ${JSON.stringify(address)}: ${why}; expected "host:port", "http://host:port" or "https://host"`);
  if (typeof address !== "string" || address.trim() === "" || /\s/.test(address)) throw bad("not a usable address");
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(address)?.[1]?.toLowerCase();
  if (scheme === undefined) {
    let url: URL;
    try {
      url = new URL(`grpc://${address}`);
    } catch {
      throw bad("not host:port");
    }
    if (url.hostname === "" || url.port === "" || url.pathname !== "" || url.search !== "") throw bad("not host:port");
    const secure = tls ?? false;
    return { target: address, tls: secure, origin: `${secure ? "https" : "http"}://${address}` };
  }
  if (scheme !== "http" && scheme !== "https") throw bad(`scheme ${scheme} is not http or https`);
  let url: URL;
  try {
    url = new URL(address);
  } catch {
    throw bad("not a URL");
  }
  if (url.hostname === "") throw bad("no host");
  const secure = tls ?? scheme === "https";
  const port = url.port !== "" ? url.port : scheme === "https" ? "443" : "80";
  return { target: `${url.hostname}:${port}`, tls: secure, origin: `${scheme}://${url.host}` };
}

/** A unary call that can be cancelled. */
export interface PendingCall {
  result: Promise<{ ok: true; response: unknown } | { ok: false; error: grpc.ServiceError }>;
  cancel(): void;
}

/** The lazily created, renewable channel to the service. */
export class Channel {
  private client: ServiceClient | undefined;
  private generationNo = 0;
  private closed = false;

  constructor(private readonly where: Target) {}

  get generation(): number {
    return this.generationNo;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Starts `method` with `request`, giving up at `deadline` (a `Date`). */
  call(method: Method, request: object, metadata: grpc.Metadata, deadline: Date): PendingCall {
    const client = this.connection();
    let handle: grpc.ClientUnaryCall | undefined;
    const result = new Promise<{ ok: true; response: unknown } | { ok: false; error: grpc.ServiceError }>((resolve) => {
      handle = client[method](request, metadata, { deadline }, (err, response) =>
        resolve(err === null ? { ok: true, response } : { ok: false, error: err }),
      );
    });
    return { result, cancel: () => handle?.cancel() };
  }

  /** Replaces the connection once per generation, however many calls ran late on it. */
  renew(generation: number): void {
    if (generation !== this.generationNo) return;
    this.generationNo += 1;
    this.client?.close();
    this.client = undefined;
  }

  close(): void {
    this.closed = true;
    this.client?.close();
    this.client = undefined;
  }

  private connection(): ServiceClient {
    if (this.client === undefined) {
      const Ctor = serviceClient();
      const credentials = this.where.tls ? grpc.credentials.createSsl() : grpc.credentials.createInsecure();
      this.client = new Ctor(this.where.target, credentials, {});
    }
    return this.client;
  }
}

const SOURCES: readonly Source[] = ["store", "deny_cache", "lease", "local_fallback", "failure_policy", "client_fallback"];

/** `SOURCE_DENY_CACHE` → `"deny_cache"`; a value this package does not know yet goes by `shared`. */
export function sourceFromPb(source: string | number, shared: boolean): Source {
  const name = String(source).replace(/^SOURCE_/, "").toLowerCase() as Source;
  if (SOURCES.includes(name)) return name;
  return shared ? "store" : "local_fallback";
}

/** A wire duration as whole seconds, rounded up; missing or negative is 0. */
export function secondsFromPb(d: PbDuration | null | undefined): number {
  if (d === null || d === undefined) return 0;
  const seconds = Number(d.seconds);
  if (!Number.isFinite(seconds) || seconds < 0) return 0;
  return d.nanos > 0 ? seconds + 1 : seconds;
}

/** The service's answer as a {@link Decision}. */
export function decisionFromPb(r: PbCheckResponse): Decision {
  const resetAfterSeconds = secondsFromPb(r.reset_after);
  const decision: Decision = {
    allowed: r.allowed,
    limit: r.limit,
    remaining: r.remaining,
    resetAfterSeconds,
    shared: r.shared,
    source: sourceFromPb(r.source, r.shared),
    limitName: r.limit_name,
    window: Number(r.window),
  };
  if (!r.allowed) {
    decision.retryAfterSeconds = r.retry_after === null ? resetAfterSeconds : secondsFromPb(r.retry_after);
  }
  return decision;
}

/** The service's `ListLimits` answer as limit specs (validated by the caller). */
export function limitsFromPb(r: PbListLimitsResponse): LimitSpec[] {
  return r.limits.map((l) => {
    const policy = ["local", "allow", "deny"].includes(l.on_store_failure) ? (l.on_store_failure as FailurePolicy) : "local";
    return {
      name: l.name,
      requests: l.requests,
      windowSeconds: l.window === null ? Number.NaN : Number(l.window.seconds),
      isDefault: l.is_default,
      onStoreFailure: policy,
    };
  });
}

/** A short, stable name for a failed call's status, for logs. */
export function failureKind(code: grpc.status): string {
  switch (code) {
    case grpc.status.UNAVAILABLE:
      return "unavailable";
    case grpc.status.DEADLINE_EXCEEDED:
    case grpc.status.CANCELLED:
      return "late";
    case grpc.status.RESOURCE_EXHAUSTED:
      return "shedding";
    case grpc.status.INTERNAL:
      return "internal";
    case grpc.status.UNAUTHENTICATED:
      return "unauthenticated";
    case grpc.status.PERMISSION_DENIED:
      return "permission_denied";
    default:
      return "failed";
  }
}
