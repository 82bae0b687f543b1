# Sourced by prometheus.sh and node-packages.sh, which want the binaries of Debian packages and
# nothing that runs.
#
# apt_install SERVICE WHAT PACKAGE...: installs the packages, as root (otherwise it prints the
# command to run as root and fails). While it installs, a policy-rc.d that exits 101 (where
# there is none already: containers usually ship one) forbids the packages' maintainer scripts
# to start services through invoke-rc.d; afterwards, on a host run by systemd, SERVICE is stopped
# and disabled for the next boot.
apt_install() {
  local service=$1 what=$2
  shift 2
  if [ "${EUID:-$(id -u)}" -ne 0 ]; then
    printf '%s is missing and installing it needs root. Run as root:\n  apt-get update && apt-get install -y --no-install-recommends %s\n' "$what" "$*" >&2
    return 1
  fi
  local policy=/usr/sbin/policy-rc.d own_policy="" rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  echo "installing $what: $*" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  if [ -n "$own_policy" ]; then
    rm -f "$policy"
  fi
  if [ "$rc" -ne 0 ]; then
    echo "apt-get failed ($rc) installing $*" >&2
    return "$rc"
  fi
  if [ -d /run/systemd/system ]; then
    systemctl disable --now --quiet "$service" 2>/dev/null || true
  fi
}
