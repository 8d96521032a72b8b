#!/usr/bin/env bash
# Headless Chromium for the browser tests, from Debian's packages (a test tool's own browser download does not
# work on these machines). Idempotent: does nothing when /usr/bin/chromium is already there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-browser: needs root to apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
