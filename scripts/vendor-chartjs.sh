#!/usr/bin/env bash
# Chart.js (https://www.chartjs.org, MIT) draws the console's charts from claims/static/console/vendor/ — the UMD
# build as npm publishes it, pinned. This re-fetches it from the npm registry: bash scripts/vendor-chartjs.sh [version].
set -euo pipefail
VERSION="${1:-4.6.1}"
DEST="$(dirname "$0")/../claims/static/console/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "chart.js@$VERSION" >/dev/null && tar xzf "chart.js-$VERSION.tgz")
mkdir -p "$DEST"
cp "$WORK/package/dist/chart.umd.min.js" "$DEST/chart-$VERSION.umd.min.js"
cp "$WORK/package/LICENSE.md" "$DEST/chart-LICENSE.md"
echo "Chart.js $VERSION → $DEST"
