#!/usr/bin/env bash
# Builds the CSI programs of test/realnode's volume test (issue 40) into the tools cache
# ($REPRIEVE_TOOLS_BIN, default .cache/bin at the repository root), each rebuilt only when its
# pin changes (a stamp file beside it records it):
#   - csi-attacher and csi-provisioner: kubernetes-csi's external attacher and provisioner;
#   - csi-mock-driver: csi-test's mock CSI driver (cmd/mock-driver), which advertises
#     PUBLISH_UNPUBLISH_VOLUME, so its volumes need attaching. csi-test removed it in v4.3.0
#     (its CHANGELOG-4.3), so it is the last release that has it, v4.2.0. The host-path driver
#     and node-driver-registrar are not served by the Go module proxy;
#   - csi-registrar: ours (test/tools/csiregistrar), the kubelet plugin registration that
#     node-driver-registrar does.
# The three upstream programs carry replace lines in their go.mod, which `go install
# module@version` refuses: each is built inside its own downloaded module, with its own go.mod
# and go.sum (checked against the checksum database by `go mod download`).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${REPRIEVE_TOOLS_BIN:-$root/.cache/bin}
mkdir -p "$bin"

ATTACHER=github.com/kubernetes-csi/external-attacher/v4@v4.13.0
PROVISIONER=github.com/kubernetes-csi/external-provisioner/v6@v6.4.0
MOCK=github.com/kubernetes-csi/csi-test/v4@v4.2.0

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# build name module@version package: go build of package inside the module's own folder.
build() {
  local name=$1 mod=$2 pkg=$3
  if [ -x "$bin/$name" ] && [ "$(cat "$bin/$name.version" 2>/dev/null)" = "$mod" ]; then
    return 0
  fi
  echo "building $name ($mod)" >&2
  local dir
  dir=$(cd "${TMPDIR:-/tmp}" && GOFLAGS= GO111MODULE=on go mod download -json "$mod" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$dir" ] || { echo "csi.sh: go mod download $mod gave no folder" >&2; exit 1; }
  # -mod=mod: csi-test v4.2.0 ships vendor/modules.txt without the vendored code.
  (cd "$dir" && go build -mod=mod -trimpath -ldflags "-s -w" -o "$bin/$name" "$pkg")
  echo "$mod" >"$bin/$name.version"
}

build csi-attacher "$ATTACHER" ./cmd/csi-attacher
build csi-provisioner "$PROVISIONER" ./cmd/csi-provisioner
build csi-mock-driver "$MOCK" ./cmd/mock-driver

# Ours, from the tools module (its k8s.io/kubelet is k8s.io/kubernetes' release): rebuilt when
# its source or that release changes.
K8S_VERSION=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
sum=$(cat "$here/csiregistrar/"*.go | sha256sum | cut -c1-16)
if ! [ -x "$bin/csi-registrar" ] || [ "$(cat "$bin/csi-registrar.version" 2>/dev/null)" != "$K8S_VERSION-$sum" ]; then
  echo "building csi-registrar" >&2
  (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin/csi-registrar" ./csiregistrar)
  echo "$K8S_VERSION-$sum" >"$bin/csi-registrar.version"
fi
