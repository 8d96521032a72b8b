// The typed client: openapi-fetch over the types openapi-typescript generates from the control plane's schema
// (src/schema.d.ts, `npm run generate`). Every path, body and answer is the schema's; nothing here is hand-typed.
// Requests that may safely be sent again are (sendWithRetries): a database failing over answers 503 for a moment.
import { createHash, randomUUID } from "node:crypto";
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

export interface ControlPlaneOptions {
  /** How many times a request is sent again where that cannot do harm (default 3). */
  retries?: number;
}

export function controlPlane(baseUrl: string, token: string, options: ControlPlaneOptions = {}) {
  const retries = options.retries ?? 3;
  return createClient<paths>({
    baseUrl,
    headers: { Authorization: `Bearer ${token}` },
    fetch: (request: Request) => sendWithRetries(request, retries),
  });
}

// Retries, as the Python SDK makes them, only where sending again cannot do harm:
// - 429 and 503, on every request: the server decided nothing (503: the transaction rolled back — a database
//   restarting or failing over; 429: refused before any work). Wait Retry-After (or a backoff) and send again.
// - A connection refused before the request was sent, on every request: the server never saw it.
// - A connection lost after sending, only where a repeat answers the same: reads, commit and batch commits (a
//   repeat returns the stored answer), stage (the same digest, the same record), renew — and claims: a claim,
//   claim-next or batch claim carries an Idempotency-Key (one per call unless the caller set one, the same on its
//   retries), so a repeat of a claim that was granted answers that grant instead of taking a second task
//   (docs/workers.md, "Retrying a claim"). Never a release: the error is the caller's.
const REPEATABLE = /\/(commit|commits|results|renew)$/;
const CLAIMS = /\/(claim|claims|claims\/batch)$/;
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN"]);

async function sendWithRetries(sent: Request, retries: number): Promise<Response> {
  const path = new URL(sent.url).pathname;
  const claim = sent.method === "POST" && CLAIMS.test(path);
  const request = claim && !sent.headers.has("Idempotency-Key") ? keyed(sent) : sent;
  const repeatable = request.method === "GET" || claim || REPEATABLE.test(path);
  for (let attempt = 0; ; attempt++) {
    const last = attempt >= retries;
    let response: Response;
    try {
      response = await fetch(request.clone());
    } catch (error) {
      const code = (error as { cause?: { code?: string } }).cause?.code ?? "";
      if (last || !(NOT_SENT.has(code) || repeatable)) throw error;
      await sleep(backoff(attempt));
      continue;
    }
    if ((response.status === 429 || response.status === 503) && !last) {
      await response.body?.cancel();
      await sleep(retryAfter(response, attempt));
      continue;
    }
    return response;
  }
}

function keyed(request: Request): Request {
  const headers = new Headers(request.headers);
  headers.set("Idempotency-Key", randomUUID());
  return new Request(request, { headers });
}

function backoff(attempt: number): number {
  return Math.min(5, 0.1 * 2 ** attempt);
}

function retryAfter(response: Response, attempt: number): number {
  const seconds = Number(response.headers.get("Retry-After"));
  return Number.isFinite(seconds) && response.headers.has("Retry-After") ? Math.min(30, seconds) : backoff(attempt);
}

function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

// claim-v1.md §1: sha256 of the canonical JSON (sorted keys, no spaces, UTF-8).
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

export function digest(value: unknown): string {
  return "sha256:" + createHash("sha256").update(canonicalJson(value), "utf8").digest("hex");
}
