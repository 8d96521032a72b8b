#!/usr/bin/env bash
# The console's two browser libraries, served from claims/static/console/vendor/ as npm publishes them, pinned:
# htmx 2.0.11 (https://htmx.org, BSD Zero Clause) and Chart.js 4.6.1 (https://www.chartjs.org, MIT).
# This re-fetches them from the npm registry: bash scripts/vendor-js.sh [htmx-version] [chartjs-version]
# (a new version needs its file name changed in templates/base.html too).
set -euo pipefail
HTMX="${1:-2.0.11}"
CHARTJS="${2:-4.6.1}"
DEST="$(dirname "$0")/../claims/static/console/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DEST"

fetch() {  # package version: unpack the npm tarball into $WORK/<package>
  mkdir -p "$WORK/$1"
  (cd "$WORK/$1" && npm pack --silent "$1@$2" >/dev/null && tar xzf ./*.tgz)
}

fetch htmx.org "$HTMX"
cp "$WORK/htmx.org/package/dist/htmx.min.js" "$DEST/htmx-$HTMX.min.js"
cp "$WORK/htmx.org/package/LICENSE" "$DEST/htmx-LICENSE"
fetch chart.js "$CHARTJS"
cp "$WORK/chart.js/package/dist/chart.umd.min.js" "$DEST/chart-$CHARTJS.umd.min.js"
cp "$WORK/chart.js/package/LICENSE.md" "$DEST/chart-LICENSE.md"
echo "htmx $HTMX, Chart.js $CHARTJS → $DEST"
