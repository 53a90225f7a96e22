#!/usr/bin/env bash
# Install Debian's Chromium and its chromedriver for the review console's browser test
# (tests/integration/test_review_browser.py), unless both are already there. No browser is
# downloaded from anywhere else: Selenium is pointed at /usr/bin/chromium and
# /usr/bin/chromedriver.
#
# Needs apt (Debian/Ubuntu) and root, as CI has; elsewhere install Chromium and a chromedriver
# of the same version at those paths.
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  exit 0
fi
command -v apt-get >/dev/null || {
  echo "browser.sh: no apt-get here; install chromium and chromedriver at /usr/bin" >&2
  exit 1
}
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi
/usr/bin/chromium --version
