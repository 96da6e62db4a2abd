/**
 * The errors of the Engram client, as the Python client (`engram_episodic.errors`) names them.
 *
 * An answer >= 400 is an `ApiError` subclass read from the service's RFC 9457 problem+json; a request
 * that got no answer is `ConnectionFailed`; an argument that cannot be sent is `InvalidRequest`.
 */

/** One field error of a problem: the field's path (`feedback.reward`, `episodes[0].task`) and why. */
export interface FieldError {
  field: string;
  reason: string;
}

/** Base class of every error the client raises on purpose. */
export class EngramError extends Error {
  /** record/episode: the episode ids the call used; retrying with them stores no copy. */
  episodeIds: string[] = [];
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * An argument cannot be sent (an empty path id, a `wait` outside 0..30 s, a field too large for one
 * request); nothing was sent. `errors` names each bad field.
 */
export class InvalidRequest extends EngramError {
  readonly errors: FieldError[];
  constructor(errors: FieldError[]) {
    super(errors.map((e) => `${e.field}: ${e.reason}`).join("; "));
    this.errors = errors;
  }
}

/**
 * The service could not be reached or did not answer in time. `maybeApplied` is false when the
 * request never reached it (refused connection, unknown host) and true when its answer was lost
 * (timeout, dropped connection): a write may then have taken effect.
 */
export class ConnectionFailed extends EngramError {
  readonly maybeApplied: boolean;
  constructor(message: string, options: { maybeApplied: boolean; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.maybeApplied = options.maybeApplied;
  }
}

/** The problem+json document of an error answer (RFC 9457), with Engram's `errors` list. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  errors?: FieldError[];
  [key: string]: unknown;
}

/**
 * The service answered with a problem (status >= 400): `status`, `title`, `detail`, the per-field
 * `errors` (422), `retryAfter` (seconds, from `Retry-After`, or null) and the whole `body`.
 */
export class ApiError extends EngramError {
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  readonly errors: FieldError[];
  readonly retryAfter: number | null;
  readonly body: Problem;
  /** True when an earlier attempt of this call was sent and its answer lost. */
  maybeApplied = false;

  constructor(status: number, body: Problem, retryAfter: number | null = null) {
    const title = String(body.title || "error");
    const detail = String(body.detail || "");
    const errors = (Array.isArray(body.errors) ? body.errors : [])
      .filter((e): e is FieldError => typeof e === "object" && e !== null)
      .map((e) => ({ field: String(e.field ?? ""), reason: String(e.reason ?? "") }));
    const lines = [`${status} ${title}${detail ? `: ${detail}` : ""}`, ...errors.map((e) => `${e.field}: ${e.reason}`)];
    super(lines.join("; "));
    this.status = status;
    this.title = title;
    this.detail = detail;
    this.errors = errors;
    this.retryAfter = retryAfter;
    this.body = body;
  }
}

/** 400 (malformed), 413 (body too large) or 422 (invalid fields, listed in `errors`). */
export class BadRequest extends ApiError {}
/** 401: the API key is missing or unknown. */
export class Unauthorized extends ApiError {}
/** 404: no such episode, fact or job in the caller's namespace. */
export class ResourceNotFound extends ApiError {}
/** 429: the consolidator lags past ENGRAM_MAX_LAG; nothing was published. See `retryAfter`. */
export class RateLimited extends ApiError {}
/** 503: the memory store is unavailable; nothing was applied. See `retryAfter`. */
export class ServiceUnavailable extends ApiError {}
/** Any other 5xx answer. */
export class ServerError extends ApiError {}

/**
 * `record` of an episode id that was forgotten before: nothing was published, and a forgotten id is
 * never stored again (record the episode under a new one).
 */
export class EpisodeForgotten extends EngramError {
  constructor(episodeId: string) {
    super(
      `${episodeId}: this episode_id was forgotten before, so nothing was published; a forgotten ` +
        "episode_id is never stored again (record it under a new one)",
    );
    this.episodeIds = [episodeId];
  }
}

/** A `wait` ran out: the episode was accepted but not projected in time, or never will be. */
export class WaitTimeout extends EngramError {
  result: unknown = null;
}

const BY_STATUS: Record<number, new (status: number, body: Problem, retryAfter: number | null) => ApiError> = {
  400: BadRequest,
  401: Unauthorized,
  404: ResourceNotFound,
  413: BadRequest,
  422: BadRequest,
  429: RateLimited,
  503: ServiceUnavailable,
};

/** The ApiError subclass for `status` (ServerError for other 5xx, ApiError otherwise). */
export function apiError(status: number, body: Problem, retryAfter: number | null = null): ApiError {
  const cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
  return new cls(status, body, retryAfter);
}
