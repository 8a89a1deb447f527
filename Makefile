# ferry: `make demo` and `make test` are the two commands a newcomer needs.
# Both install what is missing first (scripts/setup.sh, idempotent).

GO      ?= go
BIN     := bin
export PATH := /usr/local/go/bin:/usr/local/sbin:$(PATH)

.PHONY: all setup build man package lint test unit fuzz demo bench clean lab-down

all: build

setup:
	@bash scripts/setup.sh

# A static binary, named by git (a clone without tags says its commit).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# ferry is the production binary (the .deb ships it alone); ferry-lab the
# lab, benchmarks and calibration, which run bin/ferry's agents and
# memhog from beside it.
build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ferry ./cmd/ferry
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ferry-lab ./cmd/ferry-lab
	CGO_ENABLED=0 $(GO) build -o $(BIN)/memhog ./workloads/memhog
	CGO_ENABLED=0 $(GO) build -ldflags '-X main.version=$(VERSION)' -o $(BIN)/ferry-controller ./cmd/ferry-controller

# Man pages from the commands' help, into bin/man (not kept in git).
man: build
	$(BIN)/ferry man --dir $(BIN)/man

# The .deb, into $(DIST) (not kept in git): the static binary, its man
# pages and bash completion, the systemd units, the sysctl and tmpfiles
# settings, an example /etc/ferry/agent.toml (packaging/nfpm.yaml). CRIU
# is not in it: setup builds CRIU 4.2.1 (docs/DEPLOY.md).
DIST ?= dist
package: man
	mkdir -p $(BIN)/completion
	$(BIN)/ferry completion bash > $(BIN)/completion/ferry.bash
	cd tools/package && $(GO) run . --root $(CURDIR) --version '$(VERSION)' --bin $(abspath $(BIN)) --out $(abspath $(DIST))

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
