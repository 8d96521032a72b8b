// The typed client: openapi-fetch over the types openapi-typescript generates from the control plane's schema
// (src/schema.d.ts, `npm run generate`). Every path, body and answer is the schema's; nothing here is hand-typed.
import { createHash } from "node:crypto";
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

export function controlPlane(baseUrl: string, token: string) {
  return createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${token}` } });
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
