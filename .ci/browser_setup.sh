#!/usr/bin/env bash
# What the browser test (tests/test_browser_lab.py) needs on a fresh CI machine: Debian's chromium, which
# Playwright drives through its executable path (no Playwright browser download). Idempotent and quiet;
# installing needs root (CI containers run as root). The Python side (playwright) comes with m3lab's test extras.
set -euo pipefail
chromium="${M3LAB_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$chromium" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "browser_setup: $chromium is missing and installing it needs root: sudo apt-get install -y chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
"$chromium" --version >/dev/null 2>&1 || { echo "browser_setup: chromium did not install" >&2; exit 1; }
