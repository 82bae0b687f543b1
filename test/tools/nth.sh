#!/usr/bin/env bash
# Builds aws-node-termination-handler, which the pool benchmark runs in IMDS mode beside
# reprieve (test/bench), into the tools cache ($REPRIEVE_TOOLS_BIN, default .cache/bin at the
# repository root). Pinned in test/tools/nth/go.mod, a module of its own (its k8s.io pins are
# v0.30); `go install ...@version` does not work here, the proxy refuses the module's version
# list. Its main package is cmd/. Rebuilt only when the pin changes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${REPRIEVE_TOOLS_BIN:-$root/.cache/bin}
mkdir -p "$bin"

NTH_VERSION=$(cd "$here/nth" && go list -m -f '{{.Version}}' github.com/aws/aws-node-termination-handler)

if [ -x "$bin/node-termination-handler" ] && [ "$(cat "$bin/node-termination-handler.version" 2>/dev/null)" = "$NTH_VERSION" ]; then
  exit 0
fi
echo "building aws-node-termination-handler $NTH_VERSION (about two minutes on a cold cache)" >&2
(cd "$here/nth" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" \
  -o "$bin/node-termination-handler" github.com/aws/aws-node-termination-handler/cmd)
echo "$NTH_VERSION" >"$bin/node-termination-handler.version"
