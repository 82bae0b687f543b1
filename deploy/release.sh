#!/usr/bin/env bash
# Builds the release artifacts of one version into OUTDIR (`make release VERSION=X.Y.Z`):
#   release.sh VERSION OUTDIR
# - reprieve-linux-amd64 and reprieve-linux-arm64: static binaries built as `make build` and the
#   Dockerfile build them (arm64 for Graviton and Ampere spot pools);
# - reprieve-linux-ARCH.spdx.json: an SPDX 2.3 SBOM of each, from the module graph linked into it;
# - reprieve-image/: the multi-arch image (linux/amd64, linux/arm64) of those binaries as an OCI
#   image layout, built without a Docker daemon by go-containerregistry (test/release/ociimage),
#   each platform naming its SBOM; reprieve-image.digest: the digest of its image index, also
#   printed on standard output. Push it as is: `crane push dist/reprieve-image REPO:VERSION`
#   (or `skopeo copy oci:dist/reprieve-image docker://REPO:VERSION`) keeps that digest;
# - reprieve-VERSION.tgz: the chart, its version and appVersion set to VERSION and its
#   image.digest to that digest, so that every node runs the very image built here, never :latest;
# - SHA256SUMS (of the binaries, SBOMs and chart; the layout's blobs are named by their digests).
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

# The SBOMs' creation time is the commit's, so that a rebuild of one commit gives the same SBOMs and
# so the same image digest (the index names each SBOM's hash): check a published release by
# rebuilding it.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
for arch in amd64 arm64; do
  bin="$out/reprieve-linux-$arch"
  echo "building $bin" >&2
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$bin" ./cmd/reprieve
  go run ./test/release -bin "$bin" -version "$version" -out "$bin.spdx.json"
done

revision=$(git rev-parse HEAD 2>/dev/null || true)
rm -rf "$out/reprieve-image"
digest=$(go run ./test/release -layout "$out/reprieve-image" -digest-file "$out/reprieve-image.digest" \
  -version "$version" -revision "$revision" amd64="$out/reprieve-linux-amd64" arm64="$out/reprieve-linux-arm64")
echo "image index $digest in $out/reprieve-image" >&2

# The chart with its version and appVersion pinned, and image.digest set to the image built
# above in a copy of the chart (the chart in git stays tag-based: it has no image to pin yet).
chart=$(mktemp -d)
trap 'rm -rf "$chart" "$out/.helm"' EXIT
cp -R deploy/chart/reprieve "$chart/reprieve"
grep -q '^  digest: ""$' "$chart/reprieve/values.yaml" || { echo "release.sh: the chart's values.yaml has no image.digest line to set" >&2; exit 1; }
sed -i "s/^  digest: \"\"\$/  digest: \"$digest\"/" "$chart/reprieve/values.yaml"
HELM_CONFIG_HOME=${HELM_CONFIG_HOME:-$out/.helm} HELM_CACHE_HOME=${HELM_CACHE_HOME:-$out/.helm} \
  HELM_DATA_HOME=${HELM_DATA_HOME:-$out/.helm} \
  "$helm" package "$chart/reprieve" --version "$version" --app-version "$version" -d "$out" >&2
(cd "$out" && sha256sum reprieve-linux-amd64 reprieve-linux-arm64 ./*.spdx.json "reprieve-$version.tgz" >SHA256SUMS)
echo "release $version in $out" >&2
echo "$digest"
