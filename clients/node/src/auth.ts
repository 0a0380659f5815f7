/**
 * Cloud Run IAM (`--no-allow-unauthenticated`): a Google ID token whose audience is the
 * service URL, from the metadata server of the Google Cloud runtime the caller runs on,
 * sent on every call as `x-serverless-authorization: Bearer …` (Cloud Run checks that
 * header for IAM and leaves `authorization` to the service), as the Rust client does.
 *
 * `google-auth-library` does the fetching (`Compute.fetchIdToken`, which honours
 * `GCE_METADATA_HOST`) and the caching (`IdTokenClient` reuses a token until five minutes
 * before its `exp`). Concurrent first calls share one fetch. Fetching is bounded by the
 * call's deadline by the caller of {@link IdTokens.value}; a failure makes that call
 * decide locally, like any other unavailability.
 */
import { Compute, IdTokenClient } from "google-auth-library";

export class IdTokens {
  private readonly client: IdTokenClient;
  private pending: Promise<string> | undefined;

  constructor(
    readonly audience: string,
    readonly header: string,
  ) {
    this.client = new IdTokenClient({ targetAudience: audience, idTokenProvider: new Compute() });
  }

  /** The `Bearer …` value for the header: cached until near expiry, else fetched. */
  value(): Promise<string> {
    if (this.pending !== undefined) return this.pending;
    const fetching = this.client.getRequestHeaders().then((h) => {
      const value = h.get("authorization");
      if (value === null || !value.startsWith("Bearer ") || value.length <= 7) {
        throw new Error("the metadata server gave no ID token");
      }
      return value;
    });
    this.pending = fetching.finally(() => {
      this.pending = undefined;
    });
    return this.pending;
  }
}

/** The ID-token audience Cloud Run expects: the service URL without a path. */
export function audienceOf(scheme: "http" | "https", authority: string): string {
  return `${scheme}://${authority}`;
}
