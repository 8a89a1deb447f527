# ferry: `make demo` and `make test` are the two commands a newcomer needs.
# Both install what is missing first (scripts/setup.sh, idempotent).

GO      ?= go
BIN     := bin
export PATH := /usr/local/go/bin:/usr/local/sbin:$(PATH)
# A Go older than go.mod's fetches go.mod's toolchain (Debian's go.env
# says local; scripts/setup.sh says which Go it found).
export GOTOOLCHAIN ?= auto

.PHONY: all setup build build-ferry man package package-criu debs release release-check lint test unit fuzz demo bench clean lab-down

all: build

setup:
	@bash scripts/setup.sh

# A static binary, named by git (a clone without tags says its commit).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
CONTROLLER_LDFLAGS := -X main.version=$(VERSION)
# Dates in packages, tarballs and man pages: the commit's time.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)

# ferry is the production binary (the .deb ships it alone); ferry-lab the
# lab, benchmarks and calibration, which run bin/ferry's agents and
# memhog from beside it.
build: build-ferry
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ferry-lab ./cmd/ferry-lab
	CGO_ENABLED=0 $(GO) build -o $(BIN)/memhog ./workloads/memhog
	CGO_ENABLED=0 $(GO) build -ldflags '$(CONTROLLER_LDFLAGS)' -o $(BIN)/ferry-controller ./cmd/ferry-controller

build-ferry:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ferry ./cmd/ferry

# Man pages from the commands' help, into bin/man (not kept in git).
man: build-ferry
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN)/ferry man --dir $(BIN)/man

# The .deb for this machine's architecture, into $(DIST) (not kept in
# git): the static binary, its man pages and bash completion, the systemd
# units, the sysctl and tmpfiles settings, an example
# /etc/ferry/agent.toml (packaging/nfpm.yaml). It depends on ferry-criu,
# which make package-criu (or make release) builds.
DIST ?= dist
# DEB_COMPRESSION=none stores the files uncompressed (the package tests:
# a second instead of ten for ferry's).
DEB_COMPRESSION ?=
package: man
	mkdir -p $(BIN)/completion
	$(BIN)/ferry completion bash > $(BIN)/completion/ferry.bash
	cd tools/package && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run . deb --root $(CURDIR) --arch $$($(GO) env GOARCH) --version '$(VERSION)' --var BIN=$(abspath $(BIN)) --out $(abspath $(DIST)) --compression '$(DEB_COMPRESSION)'

# ferry-criu's .deb alone, for this machine's architecture, into $(DIST):
# CRIU as make release builds it (scripts/release-criu.sh: a minute the
# first time, reused after while its patches and setup.sh are unchanged).
package-criu:
	bash scripts/release-criu.sh $(BIN)/ferry-criu
	cd tools/package && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run . deb --root $(CURDIR) --config packaging/nfpm-criu.yaml --arch $$($(GO) env GOARCH) --version '$(VERSION)' --var CRIU=$(abspath $(BIN))/ferry-criu --depends $(abspath $(BIN))/ferry-criu/depends --out $(abspath $(DIST)) --compression '$(DEB_COMPRESSION)'

# The two .debs an operator installs on this machine (ferry's and
# ferry-criu's, of one version), without the rest of a release: what the
# package tests install into a clean Debian root (internal/debroot).
debs: package package-criu

# Every release artifact into $(DIST), the same bytes for the same commit
# (scripts/release.sh): static ferry and ferry-controller for each of
# RELEASE_ARCHES with their SBOMs, ferry's .deb and a tarball for each,
# ferry-criu's .deb for this machine's architecture, SHA256SUMS.
RELEASE_ARCHES ?= amd64 arm64
release:
	GO='$(GO)' VERSION='$(VERSION)' GO_LDFLAGS='$(LDFLAGS)' CONTROLLER_LDFLAGS='$(CONTROLLER_LDFLAGS)' \
	BIN='$(BIN)' DIST='$(DIST)' RELEASE_ARCHES='$(RELEASE_ARCHES)' SOURCE_DATE_EPOCH='$(SOURCE_DATE_EPOCH)' \
	bash scripts/release.sh

# make release twice, the second time with an empty Go build cache and
# CRIU built afresh in another directory, and the two SHA256SUMS compared.
release-check:
	$(MAKE) --no-print-directory release DIST=$(BIN)/release-check/a BIN=$(BIN)/release-check/bin-a
	fresh=$$(mktemp -d) && trap 'rm -rf "$$fresh"' EXIT && \
	GOCACHE=$$fresh/gocache CRIU_RELEASE_BUILD=$$fresh/criu \
	$(MAKE) --no-print-directory release DIST=$(BIN)/release-check/b BIN=$(BIN)/release-check/bin-b
	diff $(BIN)/release-check/a/SHA256SUMS $(BIN)/release-check/b/SHA256SUMS
	@echo "release-check: the two builds are identical ($$(wc -l < $(BIN)/release-check/a/SHA256SUMS) files)"

# The linters of .golangci.yml (setup installs the pinned version).
GOLANGCI_LINT ?= $(shell PATH=$(PATH) $(GO) env GOPATH)/bin/golangci-lint
lint:
	$(GOLANGCI_LINT) run ./...
	cd tools/package && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	cd tools/kube/shim && $(GOLANGCI_LINT) run --config ../../../.golangci.yml ./...

# Every test: unit and integration (real CRIU, runc, Podman, namespaces).
# Packages run one at a time: the lab's namespaces and cgroups are shared
# machine-wide names.
test: setup build
	$(GO) vet ./...
	$(MAKE) lint
	cd tools/package && $(GO) vet . && $(GO) test -count=1 .
	cd tools/kube && CGO_ENABLED=0 $(GO) vet ./ociimage && CGO_ENABLED=0 $(GO) test -count=1 ./ociimage
	cd tools/kube/shim && CGO_ENABLED=0 $(GO) vet -tags no_btrfs ./... && CGO_ENABLED=0 $(GO) test -tags no_btrfs -count=1 ./...
	FERRY_BIN=$(CURDIR)/$(BIN)/ferry FERRY_LAB_BIN=$(CURDIR)/$(BIN)/ferry-lab $(GO) test -p 1 -count=1 -timeout 40m ./...
	$(MAKE) fuzz

# A short run of every wire decoder's fuzz test, on top of its seed corpus.
FUZZTIME ?= 6s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzReadFrame ./internal/transport
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzChannelRecv ./internal/transport -fuzzminimizetime 0
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzReadFrame ./internal/transport/stripe
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzApplyDelta ./internal/rootfs -fuzzminimizetime 0
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzApplyDelta ./internal/pages
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzDecoder ./internal/pages
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzExpand ./internal/pagestream
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzServeLazy ./internal/pagestream
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzDecodePagemap ./internal/images
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzReceiveDir ./internal/images
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh FuzzDestinationSession ./internal/engine -fuzzminimizetime 0

demo: setup build
	@bash scripts/demo.sh

bench: setup build
	$(BIN)/ferry-lab bench migrate --mode cold --memory 256M --dirty-rate 100 --bandwidth 1gbit --repeat 5 --baseline link,podman --json

lab-down: build
	$(BIN)/ferry-lab lab down

clean:
	rm -rf $(BIN) $(DIST)
