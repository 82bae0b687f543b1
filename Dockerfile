# Multi-stage build of the same static binary `make build` produces, for each platform of a
# multi-platform build (docker buildx build --platform linux/amd64,linux/arm64 ...): the Go
# compiler runs on the build machine's own platform and cross-compiles for TARGETARCH.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/reprieve ./cmd/reprieve

FROM gcr.io/distroless/static:nonroot
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="reprieve" \
      org.opencontainers.image.description="Node-local Kubernetes agent: drains spot and preemptible nodes before the cloud reclaims them" \
      org.opencontainers.image.source="https://github.com/reprieve-dev/reprieve" \
      org.opencontainers.image.url="https://github.com/reprieve-dev/reprieve" \
      org.opencontainers.image.documentation="https://github.com/reprieve-dev/reprieve/blob/main/docs/install.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static:nonroot"
COPY --from=build /out/reprieve /reprieve
USER 65532:65532
ENTRYPOINT ["/reprieve"]
