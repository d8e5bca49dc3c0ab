#!/usr/bin/env bash
# System packages the test suite uses, from Debian's archive: a PostgreSQL server (the store's
# conformance suite starts its own throwaway cluster with these binaries) and Chromium (the
# Studio's browser tests drive /usr/bin/chromium with Playwright; Playwright never downloads a
# browser), and bubblewrap (the code sandbox, tapekit.sandbox). Does nothing for packages already present; without root or apt-get it says what is
# missing and the tests that need it skip.
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v bwrap >/dev/null || need+=(bubblewrap)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-system.sh: not root or no apt-get; missing ${need[*]} (their tests will skip)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || true
apt-get install -y -qq --no-install-recommends "${need[@]}"
