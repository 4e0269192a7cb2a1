#!/usr/bin/env bash
# System packages the test suite needs, from Debian's archive, installed only when missing:
#   chromium      - renders the HTML report headless (tests/test_compare.py, scripts/render_report.py)
#   postgresql-15 - the server binaries the PostgreSQL tests start themselves (tests/pgserver.py)
# Needs root (or sudo) and apt-get; elsewhere it names what is missing and exits 1.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
        echo "system_deps: missing ${missing[*]}; install them with apt-get as root" >&2; exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system_deps: missing ${missing[*]} and no apt-get to install them" >&2; exit 1
fi
echo "system_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
