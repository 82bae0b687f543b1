#!/usr/bin/env bash
# Installs promtool (with the prometheus server beside it) from Debian's `prometheus` package,
# for the rule checks and rule unit tests in deploy/. Does nothing when promtool is already on
# PATH. The package's service must stay stopped: only the binaries are wanted.
set -euo pipefail
# shellcheck source=test/tools/apt.sh
source "$(dirname "$0")/apt.sh"

if command -v promtool >/dev/null 2>&1; then
  exit 0
fi

if ! apt_install prometheus.service promtool prometheus; then
  echo "(or put any promtool, 2.x or later, on PATH)" >&2
  exit 1
fi
# Nothing here wants a Prometheus on :9090.
if pgrep -x prometheus >/dev/null 2>&1; then
  echo "warning: a prometheus server is running; this script did not mean to start one" >&2
fi

command -v promtool >/dev/null 2>&1 || { echo "prometheus installed but promtool is not on PATH" >&2; exit 1; }
echo "promtool ready: $(promtool --version 2>&1 | head -n1)" >&2
