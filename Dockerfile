# Multi-stage build of the same static binary `make build` produces.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/reprieve ./cmd/reprieve

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/reprieve /reprieve
USER 65532:65532
ENTRYPOINT ["/reprieve"]
