#!/bin/sh
# Make sure a headless Chromium and its WebDriver exist, so tests/system/test_web_browser.py can
# drive the agentpost page in a real browser (Selenium drives /usr/bin/chromium through
# /usr/bin/chromedriver). Idempotent: does nothing when both are there. Installs Debian's
# chromium and chromium-driver packages with apt-get when we are root on a Debian-like
# system; otherwise says what to install and fails, so the test's absence is never silent
# (the test itself skips with the same advice).
set -eu

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver (Debian packages) for the browser test" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends \
             chromium chromium-driver >/dev/null; }
    [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && exit 0
fi
echo "chromium is missing: install it (Debian: apt-get install chromium chromium-driver)" >&2
exit 1
