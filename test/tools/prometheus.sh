#!/usr/bin/env bash
# Installs promtool (with the prometheus server beside it) from Debian's `prometheus` package,
# for the rule checks and rule unit tests in deploy/. Does nothing when promtool is already on
# PATH. The package's service must stay stopped: only the binaries are wanted.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  exit 0
fi

if [ "${EUID:-$(id -u)}" -ne 0 ]; then
  cat >&2 <<'MSG'
promtool is missing and installing it needs root. Run as root:
  apt-get update && apt-get install -y --no-install-recommends prometheus
or put any promtool (2.x or later) on PATH.
MSG
  exit 1
fi

# Debian's maintainer scripts start prometheus.service through invoke-rc.d, which asks
# /usr/sbin/policy-rc.d first: exit 101 forbids the start. Containers usually ship such a file;
# where there is none, put one in place for the install only and take it away afterwards.
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ -n "$own_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "installing promtool from Debian's prometheus package" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# On a host run by systemd the package has also enabled the unit for the next boot: undo that,
# and stop the server should anything have started it. Nothing here wants a Prometheus on :9090.
if [ -d /run/systemd/system ]; then
  systemctl disable --now --quiet prometheus.service 2>/dev/null || true
fi
if pgrep -x prometheus >/dev/null 2>&1; then
  echo "warning: a prometheus server is running; this script did not mean to start one" >&2
fi

command -v promtool >/dev/null 2>&1 || { echo "prometheus installed but promtool is not on PATH" >&2; exit 1; }
echo "promtool ready: $(promtool --version 2>&1 | head -n1)" >&2
