#!/usr/bin/env bash
# Builds helm, which renders deploy/chart/reprieve into deploy/manifests/ (`make manifests`) and
# lints it in the tests, into the tools cache ($REPRIEVE_TOOLS_BIN, default .cache/bin at the
# repository root). helm is pinned in test/tools/helm/go.mod, a module of its own so that its
# k8s.io pins do not fight k8s.io/kubernetes' in test/tools/go.mod. Rebuilt only when that pin
# changes (a stamp file beside the binary records it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${REPRIEVE_TOOLS_BIN:-$root/.cache/bin}
mkdir -p "$bin"

HELM_VERSION=$(cd "$here/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v4)

if [ -x "$bin/helm" ] && [ "$(cat "$bin/helm.version" 2>/dev/null)" = "$HELM_VERSION" ]; then
  exit 0
fi
echo "building helm $HELM_VERSION (about a minute and a half on a cold cache)" >&2
# Without the version variable helm reports the bare major.minor of its source ("v4.3").
(cd "$here/helm" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  -o "$bin/helm" helm.sh/helm/v4/cmd/helm)
echo "$HELM_VERSION" >"$bin/helm.version"
