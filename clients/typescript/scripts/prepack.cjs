// `npm pack` from a clean clone: the build needs the dev dependencies (openapi-typescript, typescript), so install
// them first when they are missing — one command, `npm pack`, does all of it.
const { execSync } = require("node:child_process");
const { existsSync } = require("node:fs");
const here = require("node:path").resolve(__dirname, "..");
if (!existsSync(`${here}/node_modules/.bin/openapi-typescript`) || !existsSync(`${here}/node_modules/.bin/tsc`)) {
  console.error("claim-control-plane-client: installing the build's dev dependencies (npm ci)…");
  execSync("npm ci --no-audit --no-fund --ignore-scripts", { cwd: here, stdio: "inherit" });
}
execSync("npm run build", { cwd: here, stdio: "inherit" });
