#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler of the older Kubernetes
# minors that the version matrix (make test-versions) runs against, each from its own tools module
# (test/tools/k8s-1.NN/go.mod: k8s.io/kubernetes at that version and its staging modules
# replaced by the matching v0.NN.x), into $REPRIEVE_TOOLS_BIN/k8s-vX.Y.Z/. etcd, kwok and the
# peers stay the ones test/tools/build.sh builds: see test/README.md for why they are shared.
# Usage: build-versions.sh [1.30 1.33 ...] (default: every test/tools/k8s-* module). Each binary
# is rebuilt only when its pinned version changes, one build at a time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${REPRIEVE_TOOLS_BIN:-$root/.cache/bin}

minors=("$@")
if [ ${#minors[@]} -eq 0 ]; then
  for d in "$here"/k8s-*/; do minors+=("$(basename "$d" | sed 's/^k8s-//')"); done
fi

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
vpkg=k8s.io/component-base/version

for minor in "${minors[@]}"; do
  mod="$here/k8s-$minor"
  if [ ! -f "$mod/go.mod" ]; then
    echo "build-versions.sh: no tools module $mod (the minors are: $(cd "$here" && ls -d k8s-* | sed 's/^k8s-//' | tr '\n' ' '))" >&2
    exit 2
  fi
  version=$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
  out="$bin/k8s-$version"
  mkdir -p "$out"
  ldflags="-s -w -X $vpkg.gitVersion=$version -X $vpkg.gitMajor=1 \
    -X $vpkg.gitMinor=$(echo "$version" | cut -d. -f2) -X $vpkg.gitTreeState=clean \
    -X $vpkg.gitCommit=0000000000000000000000000000000000000000 -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    if [ -x "$out/$cmd" ] && [ "$(cat "$out/$cmd.version" 2>/dev/null)" = "$version" ]; then
      continue
    fi
    echo "building $cmd $version (several minutes on a cold cache)" >&2
    start=$(date +%s)
    (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$out/$cmd" "k8s.io/kubernetes/cmd/$cmd")
    echo "$version" >"$out/$cmd.version"
    echo "built $cmd $version in $(($(date +%s) - start)) s" >&2
  done
  echo "$out"
done
