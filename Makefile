# virtfleet — the two commands a new user needs are `make run` and `make test`.
# Everything they need they install (make deps) or build (the envtest binaries)
# themselves.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
TOOLS := $(GO) tool -modfile=hack/tools/go.mod
# Go packages whose files are written by generators.
GENERATED := apis package/crds internal/harness/kubevirttest/testdata

# Fuzz targets run for FUZZ_TIME each in `make test`; longer with `make fuzz FUZZ_TIME=5m`.
# The default is a count of inputs (about 3 s each on two cores), not a
# duration: a duration races Go's fuzz coordinator, which then fails a target
# with "context deadline exceeded" and no crasher (golang/go#75804, fixed in
# Go 1.27; seen here on go1.26.8 in FuzzDecodeVolumeIntent). A count has no
# deadline to race.
FUZZ_TARGETS := FuzzDecodeIntent FuzzDecodeReport FuzzDecodeNodeHeartbeat FuzzDecodeVolumeIntent FuzzDecodeVolumeReport FuzzParseKey FuzzNodeToken FuzzNodeFromToken FuzzDecodeConsoleOpen FuzzDecodeBackupIntent FuzzDecodeBackupReport
FUZZ_PKG := ./apis/wire/v1alpha1
FUZZ_TIME ?= 30000x

# make run KEEP=1 keeps the resources and intents of the last run;
# make run GUESTS=qemu adds a node on a real hypervisor with a Debian guest;
# make run CROSSPLANE=1 installs virtfleet into Crossplane's core as its packages.
RUN_FLAGS ?= $(if $(KEEP),-keep) $(if $(GUESTS),-guests=$(GUESTS)) $(if $(CROSSPLANE),-crossplane)

# Tests may take long on a 2-core machine: the envtest, libvirt and NATS suites
# start real daemons, and test/guest boots a real QEMU guest several times
# (8-13 minutes on two cores without KVM; on a fresh machine it may first wait
# for the guest image, which `make test` builds beside the other tests).
TEST_TIMEOUT ?= 60m
GO_TEST_FLAGS ?= -count=1
# go test links every test binary again in each run, and their debug
# information (DWARF) is much of a link's work and read by no one there:
# without it, a panic still names its functions and lines.
TEST_LINK := -ldflags=-w

.PHONY: help
help: ## Show the targets.
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install the Debian packages make test needs (as root; the Go-only caches build beside apt), or say which.
	@./hack/deps.sh test

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kubectl once per machine (or use KUBEBUILDER_ASSETS).
	@$(GO) run ./hack/envtest-assets >/dev/null

.PHONY: crossplane-core
crossplane-core: ## Build Crossplane core, helm and the garbage collector once per machine (the Crossplane tests run them).
	@$(GO) run ./hack/crossplane-core >/dev/null

.PHONY: kube-node
kube-node: ## Build the kubelet, kube-proxy, kube-scheduler, kube-controller-manager and CoreDNS once per machine (the tests that run a real node start them).
	@$(GO) run ./hack/envtest-assets -node >/dev/null

.PHONY: object-store
object-store: ## Build SeaweedFS's weed once per machine (the S3 object store the backup tests run).
	@$(GO) run ./hack/object-store >/dev/null

# The tests that run the images on a kubelet build them (ociimage.BuildBinary:
# static, -trimpath), which shares no compiled package with the tests' own
# builds. From an empty Go build cache, beside every test package compiling,
# that took over 20 minutes once; compiled here first, beside the other
# one-time builds, the tests' image builds only link.
.PHONY: image-binaries
image-binaries: ## Compile the images' Go packages as ociimage.BuildBinary does, into Go's build cache.
	@CGO_ENABLED=0 $(GO) build -trimpath ./hub ./agent github.com/nats-io/nats-server/v2
	@cd function && CGO_ENABLED=0 $(GO) build -trimpath -o /dev/null .

# The one-time builds take minutes each on a fresh machine; they run side by
# side so a fresh `make test` pays for the longest, not the sum. crossplane-core
# builds Crossplane (1477 packages), then Kubernetes' garbage collector alone
# (869 packages, against kube-controller-manager's 2323; from an empty build
# cache 9.4 CPU-minutes against 22.9, measured side by side), which waits for
# envtest-assets' lock and so finds all but about 60 of its packages already
# compiled by kube-apiserver's build (measured: 11 s then). kube-node waits
# for that lock too, and so builds on kube-apiserver's packages.
.PHONY: caches
caches: ## Build every once-per-machine cache in parallel: envtest and node binaries, Crossplane core, SeaweedFS, the guest image, the images' packages.
	@$(MAKE) --no-print-directory -j6 envtest-assets kube-node crossplane-core object-store guest-image image-binaries

.PHONY: guest-image
guest-image: ## Build the real-guest test image (Debian, QEMU) once per machine and recipe.
	@$(GO) run ./hack/guest-image >/dev/null

.PHONY: generate
generate: ## Regenerate deepcopy, managed-resource methods and CRDs (ours, and KubeVirt's for its tests).
	$(GO) generate ./apis/... ./internal/harness/kubevirttest/...

.PHONY: verify-generated
verify-generated: ## Fail when `make generate` would change any generated file.
	@before=$$(find $(GENERATED) -type f | sort | xargs sha256sum); \
	$(MAKE) --no-print-directory generate >/dev/null; \
	after=$$(find $(GENERATED) -type f | sort | xargs sha256sum); \
	if [ "$$before" != "$$after" ]; then \
		diff <(echo "$$before") <(echo "$$after") || true; \
		echo "generated files are stale: run 'make generate' and commit the result" >&2; exit 1; \
	fi; echo "generated files are up to date"

.PHONY: fmt-check
fmt-check: ## Fail on files gofmt would change.
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet every package (the function is a module of its own), and make run's Crossplane mode.
	$(GO) vet ./...
	$(GO) vet -tags crossplane ./cluster/local/internal/localrun/
	cd function && $(GO) vet ./...

.PHONY: build
build: ## Build every package and command.
	$(GO) build ./...

# The guest image takes 4 to 20 minutes to build once per machine (the
# Debian mirror and the load decide) and only test/guest needs it. So `make
# test` starts it first and lets it run beside the other builds and the
# tests rather than before them: test/guest's guestimage.Ensure waits for
# this build's lock and finds the image made (or builds it itself if this
# build failed, and says why). A fresh machine then pays for the tests, not
# the image plus the tests. The build, in a process group of its own, is
# stopped with the recipe (trap) on any failure.
#
# test/guest and test/e2e are the two longest packages by far, and wait on
# TCG guests more than they use the cores. Three go tests start at once, so
# that no package waits for a slot a long one holds: test/guest alone;
# test/e2e and internal/harness/openstack; and every other package, three at
# a time, the longest of those (SLOW_PACKAGES) first, as go test starts
# packages in the order they are named. The other packages mostly wait on
# the daemons they start, so they fit beside the long ones instead of after.
SEPARATE_PACKAGES := ./test/guest/ ./test/e2e/ ./internal/harness/openstack/
SLOW_PACKAGES := ./hub/internal/controller/virtualmachine/ ./test/deploy/ ./agent/driver/libvirt/ ./bench/ ./chaos/ ./internal/harness/kubevirttest/ ./hub/internal/app/ ./agent/driver/kubevirt/
.PHONY: test
test: deps ## Unit, integration (envtest, NATS, libvirtd) and e2e tests, then the fuzzers briefly.
	@setsid $(GO) run ./hack/guest-image >/dev/null & image=$$!; \
	trap 'kill -- -$$image 2>/dev/null || true' EXIT; \
	$(MAKE) --no-print-directory -j5 envtest-assets kube-node crossplane-core object-store image-binaries; \
	$(MAKE) --no-print-directory fmt-check vet verify-generated; \
	export KUBEBUILDER_ASSETS="$$($(GO) run ./hack/envtest-assets)"; \
	rest=$$($(GO) list ./... | grep -vxF -f <($(GO) list $(SEPARATE_PACKAGES) $(SLOW_PACKAGES))); \
	setsid $(GO) test $(GO_TEST_FLAGS) $(TEST_LINK) -timeout $(TEST_TIMEOUT) ./test/guest/ & guest=$$!; \
	setsid $(GO) test $(GO_TEST_FLAGS) $(TEST_LINK) -timeout $(TEST_TIMEOUT) -p 3 $(SLOW_PACKAGES) $$rest & others=$$!; \
	trap 'kill -- -$$image -$$guest -$$others 2>/dev/null || true' EXIT; \
	rc=0; \
	$(GO) test $(GO_TEST_FLAGS) $(TEST_LINK) -timeout $(TEST_TIMEOUT) ./test/e2e/ ./internal/harness/openstack/ || rc=$$?; \
	wait $$guest || rc=$$?; \
	wait $$others || rc=$$?; \
	wait $$image || echo "guest-image: the background build failed (test/guest said why)" >&2; \
	exit $$rc
	cd function && $(GO) test $(GO_TEST_FLAGS) $(TEST_LINK) ./...
	@$(MAKE) --no-print-directory fuzz

.PHONY: fuzz
fuzz: ## Run each wire decoder's fuzzer for FUZZ_TIME (hostile bytes must never panic).
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $$t for $(FUZZ_TIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$t\$$" -fuzztime=$(FUZZ_TIME) $(FUZZ_PKG); \
	done

# make run installs and builds only what it uses: libvirtd and envtest's
# binaries, and with GUESTS=qemu or CROSSPLANE=1 what those add. Its own
# binary builds after them, not beside them: the builds are bound by the
# two cores, and two at once were measured slower than one after the other.
RUN_PROFILES := run $(if $(GUESTS),guests) $(if $(CROSSPLANE),crossplane)

.PHONY: run
run: ## Start the whole system locally: control plane, NATS, hub, three agents on private libvirtds, examples.
	@./hack/deps.sh $(RUN_PROFILES)
	@$(MAKE) --no-print-directory -j3 envtest-assets $(if $(CROSSPLANE),crossplane-core) $(if $(GUESTS),object-store)
	@$(MAKE) --no-print-directory local
	@KUBEBUILDER_ASSETS="$$($(GO) run ./hack/envtest-assets)" exec bin/local -binaries=bin $(RUN_FLAGS)

# One go command builds them all, compiling what they share once and
# linking them side by side.
.PHONY: local
local: ## Build bin/local, the command behind make run (with CROSSPLANE=1, able to run Crossplane core), the hub and agent it runs, and the kubectl plugin.
	@$(GO) build $(if $(CROSSPLANE),-tags crossplane) -o bin/ ./cluster/local ./hub ./agent ./kubectl-virtfleet

.PHONY: clean
clean: ## Remove build output (not the envtest cache).
	rm -rf bin _output

# ---- Images and the Crossplane package, built in Go without a container runtime.
REGISTRY ?= ghcr.io/virtfleet
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGES_DIR ?= _output/images

.PHONY: images
images: ## Build the hub and agent images as tarballs in _output/images (static binaries, empty base, reproducible).
	$(GO) run ./cluster/images --out $(IMAGES_DIR) --registry $(REGISTRY) --version $(VERSION)

.PHONY: package
package: images ## Build the Crossplane packages (.xpkg) in _output: provider (hub image), function, Configuration.
	$(GO) run ./hack/build-package --dir package --images $(IMAGES_DIR) \
		--registry $(REGISTRY) --version $(VERSION) --out _output

# make bench BENCH_FLAGS='-sizes 10,100 -burst 0' runs other sizes; -quick is the harness's own small run.
# Beside the test driver's figures it boots one real QEMU guest (TCG without
# KVM) through the whole stack and reports create→Running, →address and →ssh
# (a few minutes, plus the guest image's first build), snapshots it and backs
# it up; -guests=false skips it. BENCH_FLAGS='-only guest' runs that guest alone.
BENCH_FLAGS ?=
.PHONY: bench
bench: deps envtest-assets ## Benchmark on the real stack (density 100 VMs/10 nodes, bursts 10/100/1000 over 10 nodes and 5000 over 50, limits, bursts of 1000 and 10,000 over simulated nodes, an idle node of 200 guests, dense nodes of 1000 simulated guests and 500 test-driver domains, one real guest with its snapshots and backups, one live migration) into bench/results/.
	@$(GO) build -o bin/bench ./bench
	@KUBEBUILDER_ASSETS="$$($(GO) run ./hack/envtest-assets)" bin/bench $(BENCH_FLAGS)

# make chaos CHAOS_FLAGS='-rounds 3 -vms 300' runs longer; see bin/chaos -h.
CHAOS_FLAGS ?=
.PHONY: chaos
chaos: deps envtest-assets ## Kill -9 an agent, the hub, NATS, a libvirtd and a whole node in turn, and cut a node off NATS, while 200 VMs (40 HA) churn; check nothing is lost, duplicated, orphaned or run twice, and HA VMs run elsewhere within 60 s at p95.
	@$(GO) build -o bin/chaos ./chaos
	@KUBEBUILDER_ASSETS="$$($(GO) run ./hack/envtest-assets)" bin/chaos $(CHAOS_FLAGS)
