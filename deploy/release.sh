#!/usr/bin/env bash
# Builds the release artifacts of one version into OUTDIR (`make release VERSION=X.Y.Z`):
#   release.sh VERSION OUTDIR
# - reprieve-linux-amd64 and reprieve-linux-arm64: static binaries built as `make build` and the
#   Dockerfile build them (arm64 for Graviton and Ampere spot pools);
# - reprieve-linux-ARCH.spdx.json: an SPDX 2.3 SBOM of each, from the module graph linked into it;
# - reprieve-VERSION.tgz: the chart, its version and appVersion (and so the image tag) set to
#   VERSION, so that every node pulls the same agent, never :latest;
# - SHA256SUMS.
# $HELM is the helm binary (default: helm on PATH).
set -euo pipefail

version=${1:?usage: release.sh VERSION OUTDIR}
out=${2:?usage: release.sh VERSION OUTDIR}
helm=${HELM:-helm}
case "$version" in
  v*) echo "release.sh: VERSION $version: give it without the leading v (a SemVer 2 chart version, the image tag)" >&2; exit 2 ;;
esac
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release.sh: VERSION $version is not X.Y.Z (SemVer 2, as Helm wants a chart version)" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)

for arch in amd64 arm64; do
  bin="$out/reprieve-linux-$arch"
  echo "building $bin" >&2
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$bin" ./cmd/reprieve
  go run ./test/release -bin "$bin" -version "$version" -out "$bin.spdx.json"
done

# The chart with its version and appVersion pinned; image.tag stays empty so that it follows.
HELM_CONFIG_HOME=${HELM_CONFIG_HOME:-$out/.helm} HELM_CACHE_HOME=${HELM_CACHE_HOME:-$out/.helm} \
  HELM_DATA_HOME=${HELM_DATA_HOME:-$out/.helm} \
  "$helm" package deploy/chart/reprieve --version "$version" --app-version "$version" -d "$out" >&2
rm -rf "$out/.helm"
(cd "$out" && sha256sum reprieve-linux-amd64 reprieve-linux-arm64 ./*.spdx.json "reprieve-$version.tgz" >SHA256SUMS)
echo "release $version in $out" >&2
