#!/usr/bin/env bash
# htmx (https://htmx.org, BSD Zero Clause) is served by the console from claims/static/console/vendor/ — the file
# as npm publishes it, pinned. This re-fetches it from the npm registry: bash scripts/vendor-htmx.sh [version].
set -euo pipefail
VERSION="${1:-2.0.11}"
DEST="$(dirname "$0")/../claims/static/console/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "htmx.org@$VERSION" >/dev/null && tar xzf "htmx.org-$VERSION.tgz")
mkdir -p "$DEST"
cp "$WORK/package/dist/htmx.min.js" "$DEST/htmx-$VERSION.min.js"
cp "$WORK/package/LICENSE" "$DEST/htmx-LICENSE"
echo "htmx $VERSION → $DEST"
