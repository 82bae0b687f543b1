#!/usr/bin/env bash
# Installs what the real node of test/realnode runs on beside the kubelet that build.sh builds:
# Debian's containerd, runc, CNI plugins (bridge, host-local, portmap, loopback in /usr/lib/cni),
# iptables (portmap's hostPort rules) and a static busybox (the shell of the notice client's
# image). Does nothing when they are all there. Only the binaries are wanted: containerd's
# service stays stopped, and the tests start their own containerd with their own config.
set -euo pipefail

have() {
  command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 &&
    command -v iptables >/dev/null 2>&1 && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/portmap ] &&
    [ -x /bin/busybox ] && file -b /bin/busybox 2>/dev/null | grep -q 'statically linked'
}
if have; then
  exit 0
fi

packages="containerd runc containernetworking-plugins iptables busybox-static file"
if [ "${EUID:-$(id -u)}" -ne 0 ]; then
  cat >&2 <<MSG
The real node's packages are missing and installing them needs root. Run as root:
  apt-get update && apt-get install -y --no-install-recommends $packages
(test/realnode skips without them; REPRIEVE_E2E_REQUIRED=1 makes that a failure).
MSG
  exit 1
fi

# As for promtool (prometheus.sh): forbid the package's maintainer scripts to start
# containerd.service while installing, where no policy-rc.d says so already.
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ -n "$own_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "installing the real node's packages: $packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages >/dev/null

if [ -d /run/systemd/system ]; then
  systemctl disable --now --quiet containerd.service 2>/dev/null || true
fi
have || { echo "the real node's packages installed, but containerd, runc, iptables, the CNI plugins or a static busybox are still missing" >&2; exit 1; }
echo "real node packages ready: $(containerd --version 2>&1 | head -n1); $(runc --version 2>&1 | head -n1)" >&2
