# reprieve: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := build

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
TOOLS_BIN := $(CURDIR)/.cache/bin
export REPRIEVE_TOOLS_BIN ?= $(TOOLS_BIN)
# The reprieve binary the end-to-end tests, the benchmark and the demo run. It is built here,
# before any of them starts a clock: cold, the build alone takes minutes on two cores.
E2E_BIN := $(CURDIR)/.cache/e2e/reprieve

.PHONY: build release e2e-bin tools demo-tools helm nth manifests promtool node-packages test test-versions unit e2e realnode lint fuzz fuzz-outside fuzz-run demo bench soak soak-pressure record-series clean

## build: the static binary the Dockerfile builds (CGO off, trimmed paths, version baked in)
build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o bin/reprieve ./cmd/reprieve

## release: the release artifacts in $(DIST) for VERSION=X.Y.Z: static linux/amd64 and linux/arm64
## binaries, an SPDX SBOM of each, their multi-arch image as an OCI layout (reprieve-image/, built
## without a Docker daemon) and its digest (reprieve-image.digest), and the chart packaged with
## its appVersion pinned and image.digest set to that digest
DIST ?= dist
release: helm
	HELM=$(REPRIEVE_TOOLS_BIN)/helm bash deploy/release.sh "$(VERSION)" "$(DIST)"

## e2e-bin: the binary the tests run, built as `build` builds it (the version says e2e: v0.0.0-e2e)
e2e-bin:
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w -X main.version=v0.0.0-e2e' -o $(E2E_BIN) ./cmd/reprieve

## tools: build the real control plane and peers from the Go module proxy (cached)
tools:
	bash test/tools/build.sh

## demo-tools: only what the demo runs (a fresh clone's `make demo` builds no kubelet, no CSI
## programs, no helm, no kube-scheduler); `make tools` builds these and the rest
DEMO_TOOLS := kube-apiserver kube-controller-manager etcd kwok ec2-metadata-mock
demo-tools:
	bash test/tools/build.sh $(DEMO_TOOLS)

## helm: only helm (pinned in test/tools/helm/go.mod), into the same cache; `make tools` builds it too
helm:
	bash test/tools/helm.sh

## nth: aws-node-termination-handler (pinned in test/tools/nth/go.mod), which `make bench`'s pool
## scenario runs beside reprieve; no test needs it
nth:
	bash test/tools/nth.sh

## manifests: render deploy/manifests/ from the Helm chart deploy/chart/reprieve (a test checks
## that the committed files equal a fresh render)
manifests: helm
	cp deploy/prometheus/rules.yaml deploy/chart/reprieve/files/rules.yaml
	cp deploy/grafana/dashboard.json deploy/chart/reprieve/files/dashboard.json
	HELM=$(REPRIEVE_TOOLS_BIN)/helm bash deploy/chart/render.sh deploy/manifests

## promtool: Debian's prometheus package (promtool and the server) for the rule and alert tests
promtool:
	bash test/tools/prometheus.sh

## node-packages: Debian's containerd, runc, CNI plugins, iptables and a static busybox for the
## real node of test/realnode (the kubelet itself comes from `make tools`)
node-packages:
	bash test/tools/node-packages.sh

## lint: formatting and vet. vet runs with -race so that the packages it compiles are the ones
## `go test -race` reuses from the build cache (a plain vet would compile the tree once more)
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	go vet -race ./...

## unit: unit tests only (no control plane)
unit:
	go test -race -count=1 ./agent/... ./providers/... ./cmd/... ./kubelet/... ./deploy/...

## fuzz: a short run of every fuzz target (the parsers of outside input); seeds are in the tests,
## so go test runs every seed of every target too. Longer: make fuzz FUZZTIME=10m
FUZZTIME ?= 20000x
# What comes from outside the cluster's control: metadata payloads and the kubelet's files.
# make test fuzzes these. Their packages do not link client-go, whose instrumented compile
# (-fuzz builds every package again with coverage) cost 7 of the 10 minutes of a cold fuzz run.
FUZZ_OUTSIDE := FuzzParseSpotInstanceAction:./providers/aws FuzzParseRebalance:./providers/aws \
  FuzzParseScheduledEvents:./providers/aws FuzzParseDocument:./providers/azure \
  FuzzParseValues:./providers/gcp FuzzParseUpcoming:./providers/gcp \
  FuzzParseThresholds:./kubelet FuzzParseSummary:./kubelet FuzzParseConfig:./kubelet FuzzParseFlagsEnvironment:./kubelet
# The operator's own flag values (the agent package links client-go): make fuzz only.
FUZZ_TARGETS := $(FUZZ_OUTSIDE) FuzzParseTaint:./agent/config
fuzz:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_RUN="$(FUZZ_TARGETS)"
fuzz-outside:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_RUN="$(FUZZ_OUTSIDE)"
fuzz-run:
	@set -e; for t in $(FUZZ_RUN); do \
	  echo "fuzz $${t%%:*} ($(FUZZTIME))"; \
	  go test -run '^$$' -fuzz "^$${t%%:*}$$" -fuzztime $(FUZZTIME) "$${t#*:}"; \
	done

# test/realnode changes the host and measures memory and disk pressure against the kubelet, so it
# runs after the other packages, alone (about 8 minutes once compiled: test/README.md; issue 37's
# DaemonSet and soft-threshold tests add 2.5 to 4 more: docs/benchmarks.md). Its timeout is 30
# minutes for 11 of them: a memory run waits for a quiet machine first and runs again, up to three
# times in all, while the machine's other work moved its memory (test/realnode/quiet_test.go),
# each rerun after up to 3 minutes' wait for quiet.
REALNODE := ./test/realnode
# The memory runs that ran again (test/realnode/quiet_test.go), printed after the package.
RERUNS := $(CURDIR)/.cache/realnode-reruns.txt
NOT_REALNODE = $$(go list ./... | grep -v '/test/realnode$$')
# The end-to-end tests that share no state run side by side on the one control plane
# (t.Parallel; test/README.md lists which and why). They mostly wait for real windows of
# 30-120 s, so more of them than GOMAXPROCS (2 here) run at once: 32 (of about 55). With 16 the
# last ones waited some 30 s for a slot; with all of them at once the burst of their starts slowed
# the API server past some first evictions' bounds.
E2E_PARALLEL ?= 32

## e2e: end-to-end tests on the real control plane, then on the real node
e2e: tools promtool node-packages e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 go test -race -count=1 -timeout 45m -parallel $(E2E_PARALLEL) $$(go list ./test/... | grep -v '/test/realnode$$')
	@rm -f $(RERUNS)
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 REPRIEVE_REALNODE_RERUNS=$(RERUNS) go test -race -count=1 -timeout 30m $(REALNODE)
	@if [ -s $(RERUNS) ]; then echo "realnode: memory runs that ran again (the machine's other work moved its memory):"; cat $(RERUNS); fi

## test: everything CI runs: lint, unit and end-to-end tests (the real node's last)
test: tools promtool node-packages lint fuzz-outside e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 go test -race -count=1 -timeout 45m -parallel $(E2E_PARALLEL) $(NOT_REALNODE)
	@rm -f $(RERUNS)
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 REPRIEVE_REALNODE_RERUNS=$(RERUNS) go test -race -count=1 -timeout 30m $(REALNODE)
	@if [ -s $(RERUNS) ]; then echo "realnode: memory runs that ran again (the machine's other work moved its memory):"; cat $(RERUNS); fi

## test-versions: the version matrix: the version-sensitive end-to-end tests (VERSION_TESTS)
## against kube-apiserver, kube-controller-manager and kube-scheduler of each older Kubernetes
## the chart admits (K8S_MINORS; each a tools module test/tools/k8s-1.NN, built by test/tools/build-versions.sh
## into $(REPRIEVE_TOOLS_BIN)/k8s-vX.Y.Z). make test runs them on the pinned version (v1.37.2).
K8S_MINORS ?= 1.30 1.33
VERSION_TESTS := ^(TestServerVersion|TestAgentTokenAttacks|TestAgentTokenNodeStatus|TestDoctor|TestAdmissionPolicyBindsTheAgentToItsNode|TestPolicyHostileTokens|TestHostPathMountsStoredRecursiveReadOnly|TestEvictionGuardBindsEvictionsToTheNode|TestEvictionGuardIndex|TestAdversityStatusPatchIsNodeBound|TestPodNoticeWarnsPodsUnderThePolicy|TestAdmissionWarningsForSpotWorkloads|TestRecordWriteCheckTaintPolicy|TestSpotInterruption|TestWithTaintEvictionController)$$
test-versions: tools e2e-bin
	@set -eo pipefail; for m in $(K8S_MINORS); do \
	  dir=$$(bash test/tools/build-versions.sh $$m | tail -n 1); \
	  echo "version matrix: Kubernetes $${dir##*/k8s-} ($$dir)"; \
	  REPRIEVE_K8S_BIN_DIR=$$dir REPRIEVE_WANT_K8S_VERSION=$${dir##*/k8s-} REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 \
	    go test -race -count=1 -timeout 20m -parallel $(E2E_PARALLEL) -run '$(VERSION_TESTS)' ./test/e2e/; \
	done

## realnode: only the real node's tests (root; make tools node-packages first)
realnode: e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 go test -race -count=1 -v -timeout 30m $(REALNODE)

## demo: a spot interruption on a local control plane with a simulated cloud, with a table
## (PROVIDER=aws|gcp|azure), kube-controller-manager beside it. More: make demo PROVIDER=gcp
## DEMO_ARGS=-scenario=gpu-maintenance; DEMO_ARGS=-interruption-eviction=kube-controller-manager
## shows the NoExecute mode
PROVIDER ?= aws
DEMO_ARGS ?=
# Built with e2e-bin's settings (CGO off, trimmed paths), so that a cold build compiles client-go
# and the rest once for both. Only the demo's tools (demo-tools), not every test's.
demo: demo-tools e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) CGO_ENABLED=0 go run -trimpath ./test/demo -provider=$(PROVIDER) $(DEMO_ARGS)

## bench: the benchmark program test/bench on the real control plane (about 20 minutes); it rewrites
## the generated part of docs/benchmarks.md and docs/benchmarks-compliance-*.svg. More runs:
## make bench BENCH_ARGS='-runs 5'
BENCH_ARGS ?=
bench: tools nth e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) CGO_ENABLED=0 go run -trimpath ./test/bench $(BENCH_ARGS)

## soak: 50 interruptions back to back against one agent; goroutines and memory must not grow
## (not in make test: about 10 minutes)
soak: tools e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 REPRIEVE_SOAK=1 go test -count=1 -run '^TestSoak$$' -v -timeout 40m ./test/e2e/

## soak-pressure: ten minutes of healthy workloads on the real node with reprieve as the chart runs
## it, images filling the disk past 85% with the kubelet's image GC on; nothing may be evicted
## (issue 47; root; not in make test)
soak-pressure: e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 REPRIEVE_PRESSURE_SOAK=1 go test -count=1 -run '^TestHealthyPressureSoakOnRealNode$$' -v -timeout 40m $(REALNODE)

## record-series: record the pressure replay's real series again, each without reprieve, into
## agent/pressure/replay/testdata (about 40 minutes; RECORD_ONLY=regexp picks some)
record-series: e2e-bin
	REPRIEVE_BIN=$(E2E_BIN) REPRIEVE_E2E_REQUIRED=1 REPRIEVE_RECORD_SERIES=testdata REPRIEVE_RECORD_ONLY='$(RECORD_ONLY)' go test -count=1 -run '^TestRecordPressureSeries$$' -v -timeout 90m $(REALNODE)

clean:
	rm -rf bin
