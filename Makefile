# mcpexec — run agents' Python against their MCP tools, as a distributed system.
SHELL := /bin/bash
GO ?= go
# Build tags that keep the Podman bindings free of C libraries (static binaries).
TAGS := remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp
export CGO_ENABLED ?= 0
IMAGE ?= localhost/mcpexec-sandbox:latest
HTTP ?= 127.0.0.1:8080
# Debian packages the system and its tests need (chromium drives the console's tests; the
# -dev ones let plain `go build ./...` without the tags compile the Podman bindings' C parts).
APT_PACKAGES := podman runc uidmap debootstrap python3 ca-certificates gcc libc6-dev libgpgme-dev libbtrfs-dev docker.io chromium
# The Docker engine of mcpexec's own that the Docker runtime's tests use
# (deploy/docker/start-dockerd.sh starts it beside any other engine).
DOCKER_SOCK ?= /run/mcpexec-docker.sock

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## install Podman and the other Debian packages (needs root and apt)
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		if [ "$$(id -u)" -ne 0 ]; then echo "make deps: need root to apt-get install$$missing (run with sudo)"; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@# Subordinate ids for rootful Podman's --userns=auto (a user namespace per sandbox).
	@if [ "$$(id -u)" -eq 0 ]; then for f in /etc/subuid /etc/subgid; do \
		grep -q '^containers:' $$f 2>/dev/null || echo 'containers:2147483647:2147483648' >> $$f; done; fi

.PHONY: image
image: deps ## build the sandbox image locally (no registry needed)
	bash deploy/sandbox/build.sh $(IMAGE)

.PHONY: image-slim
image-slim: deps ## build the slim sandbox image (python3 and Node.js, no data libraries) as localhost/mcpexec-sandbox:slim; use it with --image
	bash deploy/sandbox/build.sh --slim localhost/mcpexec-sandbox:slim

.PHONY: docker-engine
docker-engine: image ## start mcpexec's own Docker engine (socket DOCKER_SOCK, default /run/mcpexec-docker.sock) with the sandbox image loaded
	MCPEXEC_DOCKER_SOCK=$(DOCKER_SOCK) bash deploy/docker/start-dockerd.sh $(IMAGE)

.PHONY: docker-stop
docker-stop: ## stop the Docker engine docker-engine started
	MCPEXEC_DOCKER_SOCK=$(DOCKER_SOCK) bash deploy/docker/start-dockerd.sh --stop

.PHONY: build
build: ## build frontend, worker and broker into bin/
	$(GO) build -tags "$(TAGS)" -o bin/ ./cmd/frontend ./cmd/worker ./cmd/broker

.PHONY: run
run: image build ## start the embedded default: MCP on http://$(HTTP)/mcp
	./bin/frontend --http $(HTTP)

.PHONY: test
# Where make test keeps its whole output; on a failure it ends with a summary
# (tools/test-summary.sh) of what failed and where a timed-out test waited.
TEST_LOG ?= bin/test.log
test: image docker-engine ## install what tests need, then run all tests (race detector on) on Podman and Docker, OAuth against Ory Hydra (built from tools/oauth)
	@mkdir -p $(dir $(TEST_LOG))
	CGO_ENABLED=1 MCPEXEC_REQUIRE_PODMAN=1 MCPEXEC_REQUIRE_DOCKER=1 MCPEXEC_REQUIRE_OAUTH=1 MCPEXEC_DOCKER=unix://$(DOCKER_SOCK) $(GO) test -race -tags "$(TAGS)" -timeout 20m -p 1 ./... 2>&1 | tee $(TEST_LOG); \
	rc=$${PIPESTATUS[0]}; if [ $$rc -ne 0 ]; then bash tools/test-summary.sh $(TEST_LOG); fi; exit $$rc

.PHONY: faults
faults: ## the fault suite's long schedule: power cuts (lazyfs), kill -9, pause, partition under jobs and update_memory; names each node whose broker replaced a jobs stream no replica would lead (docs/design.md); prints a Jepsen-style table (MCPEXEC_FAULTS_LOG=1 for the fleet's logs, =warn for its warnings); then one broker cut three times (and its negative control), then run_python over MCP with node 0 killed, ten times
	MCPEXEC_FAULTS=long $(GO) test -tags "$(TAGS)" -count=1 -timeout 30m -v -run '^(TestFaults|TestSyncOffLosesWrites|TestOneNodePowerCut|TestOneNodeSyncOffLosesWrites)$$' ./internal/faults/ 2>&1 | grep -vE '^(=== (RUN|PAUSE|CONT)|PASS$$)'; exit $${PIPESTATUS[0]}
	$(GO) test -tags "$(TAGS)" -count=10 -timeout 30m -v -run '^TestRunPythonNodeLost$$' ./internal/e2e/ 2>&1 | grep -E '^(--- |ok|FAIL)|nodelost_test'; exit $${PIPESTATUS[0]}

.PHONY: test-short
test-short: ## run the tests that need no Podman or Docker
	CGO_ENABLED=1 $(GO) test -race -tags "$(TAGS)" -short ./...

.PHONY: bench
# Iterations of each benchmark; BENCH selects them (a regexp).
BENCHTIME ?= 50x
BENCH ?= .
bench: image ## run the benchmarks: the warm-call table (bench-table), run_python p50/p90 through the fleet next to `podman run --rm`, warm/cold sandbox, throughput (BENCH=Throughput BENCHTIME=20000x), state reads over 1M records, update_memory
	MCPEXEC_REQUIRE_PODMAN=1 $(GO) test -tags "$(TAGS)" -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -timeout 30m ./...
	$(MAKE) bench-batch

.PHONY: bench-table
bench-table: image ## the warm-call table alone (also part of bench): warm calls of both languages, a proxied call's overhead, the concurrency matrix
	MCPEXEC_REQUIRE_PODMAN=1 $(GO) test -tags "$(TAGS)" -run '^$$' -bench 'WarmCalls|ProxiedEcho|Concurrency' -benchtime $(BENCHTIME) -timeout 30m ./internal/e2e

.PHONY: bench-batch
bench-batch: image build ## N jobs (N=200, RUNS=3), each in a process of its own, through broker+worker+frontend vs 4 lanes of podman run --rm; median ratio; peak RSS
	IMAGE=$(IMAGE) bash deploy/bench/bench-batch.sh

.PHONY: vet
# The linters are Go tool dependencies of a module of their own (tools/go.mod), so
# their versions are pinned and their many dependencies stay out of go.mod.
LINT := $(GO) tool -modfile=tools/go.mod
vet: ## gofmt, go vet, staticcheck and golangci-lint (.golangci.yml; pinned in tools/go.mod)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet -tags "$(TAGS)" ./...
	$(LINT) staticcheck -tags "$(TAGS)" ./...
	$(LINT) golangci-lint run --allow-parallel-runners --build-tags "$(TAGS)" ./...

.PHONY: tags
tags: ## print the Go build tags (go test -tags "$$(make -s tags)" ./...)
	@echo "$(TAGS)"

.PHONY: clean
clean: ## remove build output and the default data dir
	rm -rf bin data
