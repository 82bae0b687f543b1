#!/usr/bin/env bash
# Installs what the real node of test/realnode runs on beside the kubelet that build.sh builds:
# Debian's containerd, runc, CNI plugins (bridge, host-local, portmap, loopback in /usr/lib/cni),
# iptables (portmap's hostPort rules) and a static busybox (the shell of the notice client's
# image). Does nothing when they are all there. Only the binaries are wanted: containerd's
# service stays stopped, and the tests start their own containerd with their own config.
set -euo pipefail
# shellcheck source=test/tools/apt.sh
source "$(dirname "$0")/apt.sh"

have() {
  command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 &&
    command -v iptables >/dev/null 2>&1 && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/portmap ] &&
    [ -x /bin/busybox ] && file -b /bin/busybox 2>/dev/null | grep -q 'statically linked'
}
if have; then
  exit 0
fi

packages="containerd runc containernetworking-plugins iptables busybox-static file"
# shellcheck disable=SC2086
if ! apt_install containerd.service "the real node's packages" $packages; then
  echo "(test/realnode skips without them; REPRIEVE_E2E_REQUIRED=1 makes that a failure)" >&2
  exit 1
fi
have || { echo "the real node's packages installed, but containerd, runc, iptables, the CNI plugins or a static busybox are still missing" >&2; exit 1; }
echo "real node packages ready: $(containerd --version 2>&1 | head -n1); $(runc --version 2>&1 | head -n1)" >&2
