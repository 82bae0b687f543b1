#!/usr/bin/env bash
# Builds the real control-plane programs, the kubelet and the peers that the end-to-end tests run
# against into a git-ignored cache ($REPRIEVE_TOOLS_BIN, default .cache/bin at the repository
# root). Each binary is rebuilt only when its pinned version changes (a stamp file beside it
# records it).
#   build.sh            every tool (make tools, which make test needs)
#   build.sh NAME...    only these of kube-apiserver, kube-controller-manager, kube-scheduler,
#                       kubelet, etcd, kwok, ec2-metadata-mock, csi, helm (make demo-tools: what
#                       the demo runs)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${REPRIEVE_TOOLS_BIN:-$root/.cache/bin}
mkdir -p "$bin"

K8S_VERSION=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
ETCD_VERSION=$(cd "$here" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
KWOK_VERSION=$(cd "$here" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
IMDS_MOCK_VERSION=v1.13.0

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

want=("$@")
wanted() { # name: true when every tool is wanted, or name is among those asked for
  [ ${#want[@]} -eq 0 ] && return 0
  local w
  for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}
for w in "${want[@]}"; do
  case "$w" in
    kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | etcd | kwok | ec2-metadata-mock | csi | helm) ;;
    *) echo "build.sh: unknown tool $w" >&2; exit 2 ;;
  esac
done

fresh() { # name version: true when $bin/name was built at version
  [ -x "$bin/$1" ] && [ "$(cat "$bin/$1.version" 2>/dev/null)" = "$2" ]
}
stamp() { echo "$2" >"$bin/$1.version"; }

vpkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 \
  -X $vpkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $vpkg.gitTreeState=clean \
  -X $vpkg.gitCommit=0000000000000000000000000000000000000000 -X $vpkg.buildDate=1970-01-01T00:00:00Z"

# The kubelet runs the one real node of test/realnode (containerd, runc and CNI plugins come
# from Debian: test/tools/node-packages.sh).
# The Kubernetes programs wanted and not fresh are built by one `go build`, which compiles the
# packages they share once and spreads the work over every core.
k8s_cmds=()
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  if wanted "$cmd" && ! fresh "$cmd" "$K8S_VERSION"; then k8s_cmds+=("$cmd"); fi
done
if [ ${#k8s_cmds[@]} -gt 0 ]; then
  echo "building ${k8s_cmds[*]} $K8S_VERSION (several minutes on a cold cache)" >&2
  outdir=$(mktemp -d "$bin/.build.XXXXXX")
  pkgs=()
  for cmd in "${k8s_cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  (cd "$here" && go build -trimpath -ldflags "$k8s_ldflags" -o "$outdir/" "${pkgs[@]}")
  for cmd in "${k8s_cmds[@]}"; do
    mv "$outdir/$cmd" "$bin/$cmd"
    stamp "$cmd" "$K8S_VERSION"
  done
  rmdir "$outdir"
fi

if wanted etcd && ! fresh etcd "$ETCD_VERSION"; then
  echo "building etcd $ETCD_VERSION" >&2
  (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
fi

# kwok is built in this module (tools.go imports it), against the k8s.io libraries kube-apiserver
# uses, so that a cold build compiles them once: its own go.mod pins older ones (v0.36), which
# `go install kwok@version` compiled a second time. This module's other pins are the agent's own
# (go.mod at the root), so that `make e2e-bin` finds client-go and the rest compiled too.
if wanted kwok && ! fresh kwok "$KWOK_VERSION"; then
  echo "building kwok $KWOK_VERSION" >&2
  (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
  stamp kwok "$KWOK_VERSION"
fi
# amazon-ec2-metadata-mock installs from its own module with its own pins (a small one).
if wanted ec2-metadata-mock && ! fresh ec2-metadata-mock "$IMDS_MOCK_VERSION"; then
  echo "building ec2-metadata-mock $IMDS_MOCK_VERSION" >&2
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" \
    "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$IMDS_MOCK_VERSION"
  stamp ec2-metadata-mock "$IMDS_MOCK_VERSION"
fi

# kwok's stage files ship inside its module; copy the ones the tests use next to the binaries.
stages="$bin/kwok-stages"
if wanted kwok && { [ ! -d "$stages" ] || [ "$(cat "$stages/version" 2>/dev/null)" != "$KWOK_VERSION" ]; }; then
  dir=$(cd "${TMPDIR:-/tmp}" && GOFLAGS= GO111MODULE=on go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$stages" && mkdir -p "$stages"
  cp -r "$dir/kustomize/stage/." "$stages/"
  chmod -R u+w "$stages"
  echo "$KWOK_VERSION" >"$stages/version"
fi
# The CSI driver and kubernetes-csi's sidecars of test/realnode's volume test (csi.sh).
if wanted csi; then REPRIEVE_TOOLS_BIN="$bin" bash "$here/csi.sh"; fi
# helm has a module of its own (test/tools/helm/go.mod); helm.sh builds it the same way.
if wanted helm; then REPRIEVE_TOOLS_BIN="$bin" bash "$here/helm.sh"; fi
# aws-node-termination-handler is built by `make nth` (test/tools/nth.sh) for `make bench` only:
# no test runs it, and a cold build costs CI about two minutes.

echo "tools ready in $bin" >&2
