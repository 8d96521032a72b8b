// The package's entry point: the typed client and the schema's types, generated from the control plane's committed
// OpenAPI schema (../openapi.json) when the package is built.
export { canonicalJson, controlPlane, digest } from "./client.js";
export type { components, operations, paths } from "./schema.js";
