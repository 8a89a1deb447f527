#!/usr/bin/env bash
# Installs what ferry needs on a Debian 12 host: runtimes, network tools and a
# CRIU that works on recent kernels (4.2.1, built from Debian's own source
# tarball). Idempotent: every step checks first and does nothing when the host
# already has what it needs.
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_DEB_VERSION=4.2.1-1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_BIN=/usr/local/sbin/criu
# ferry's own small fixes to CRIU, applied when it builds CRIU; the marker
# beside the binary records which, so a changed patch set triggers a rebuild.
PATCH_DIR="$(cd "$(dirname "$0")" && pwd)/criu-patches"
CRIU_MARKER=/usr/local/sbin/.criu-ferry-build
# CRIU caches what it learns of the kernel (its "kerndat": ~45 ms of probes
# on every dump and every restore here) only on a tmpfs, in the directory it
# was built with. /run is no tmpfs on this kind of machine, so ferry's CRIU
# keeps its cache in a root-only tmpfs of its own.
CRIU_RUNDIR=/run/criu
# Built without GnuTLS: CRIU's own TLS (its page server's --tls) is never
# used, since ferry's session carries the pages under its own TLS, and
# GnuTLS's start-up was half of every CRIU start (3.5 ms against 1.7 here).
# runc starts CRIU three times for a lazy dump and twice for a restore, all
# while the container is frozen.
CRIU_MAKE_OPTS=(NO_GNUTLS=1)
CACHE=${FERRY_CACHE:-/var/cache/ferry}
PIPE_MAX_MIN=$((4 * 1024 * 1024))
PIPE_MAX_SET=$((16 * 1024 * 1024))

log() { printf 'setup: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "must run as root (CRIU, namespaces and cgroups need it)"; exit 1; }

PKGS=(runc iptables iproute2 iperf3 busybox-static podman uidmap
      libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
      python3-protobuf libnl-3-dev libnet1-dev libcap-dev pkg-config libbsd-dev
      libnftables-dev uuid-dev gcc make xz-utils patch util-linux
      redis-server lxc mmdebstrap debootstrap memcached mosquitto mosquitto-clients
      postgresql-15 containerd docker.io
      chromium)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  apt-get update -qq
  # No service starts on install: the machine's own dockerd would set the
  # firewall's FORWARD policy to DROP, cutting the lab's bridge. The tests
  # and the lab run daemons of their own.
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
fi

# version_ge A B: true when version A >= B.
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

# Go: go.mod names the version ferry builds with. A go command of 1.21 or
# later fetches that toolchain itself when it is older (GOTOOLCHAIN=auto,
# which the Makefile exports: Debian's go.env says local). Debian 12's own
# Go is 1.19, too old for that, so such a machine gets bookworm-backports'.
GO_WANT=$(awk '$1 == "go" {print $2; exit}' "$(dirname "$0")/../go.mod")
# The machine's own version, asked outside the module (inside, auto would
# already have switched).
go_local() { (cd / && PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN=local go env GOVERSION 2>/dev/null | sed 's/^go//'); }
GO_HAVE=$(go_local || true)
if [ -z "$GO_HAVE" ] || ! version_ge "$GO_HAVE" 1.21; then
  log "Go ${GO_HAVE:-missing} cannot fetch go$GO_WANT: installing golang from bookworm-backports"
  if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo 'deb http://deb.debian.org/debian bookworm-backports main' > /etc/apt/sources.list.d/ferry-backports.list
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports golang-go >/dev/null
  GO_HAVE=$(go_local)
fi
if ! version_ge "$GO_HAVE" "$GO_WANT"; then
  log "Go $GO_HAVE is older than go.mod's $GO_WANT: the go command fetches go$GO_WANT from the module proxy (GOTOOLCHAIN=auto)"
fi

build_id() { echo "$CRIU_VERSION $(cat "$PATCH_DIR"/*.patch 2>/dev/null | sha256sum | cut -c1-16) rundir=$CRIU_RUNDIR ${CRIU_MAKE_OPTS[*]}"; }

criu_ok() {
  local bin v
  bin=$(command -v criu 2>/dev/null) || return 1
  # A CRIU that ferry built is rebuilt when ferry's patches changed.
  if [ "$bin" = "$CRIU_BIN" ] && [ "$(cat "$CRIU_MARKER" 2>/dev/null)" != "$(build_id)" ]; then
    return 1
  fi
  v=$("$bin" --version 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$v" ] && version_ge "$v" "$CRIU_VERSION" || return 1
  "$bin" check >/dev/null 2>&1
}

build_criu() {
  local src tarball uri work
  mkdir -p "$CACHE"
  tarball="$CACHE/criu_${CRIU_VERSION}.orig.tar.xz"
  if [ ! -f "$tarball" ] || ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1=="deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$uri" ] || { log "cannot find the Debian mirror this system uses"; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    printf 'deb-src %s forky main\ndeb-src %s sid main\n' "$uri" "$uri" >"$work/src.list"
    mkdir -p "$work/lists/partial"
    local opts=(-o "Dir::Etc::SourceList=$work/src.list" -o Dir::Etc::SourceParts=/nonexistent
                -o "Dir::State::Lists=$work/lists")
    log "fetching CRIU $CRIU_DEB_VERSION source from $uri"
    apt-get "${opts[@]}" -o APT::Sandbox::User=root update -qq
    (cd "$work" && apt-get "${opts[@]}" -o APT::Sandbox::User=root source --download-only --tar-only "criu=$CRIU_DEB_VERSION" >/dev/null)
    mv "$work/criu_${CRIU_VERSION}.orig.tar.xz" "$tarball"
  fi
  echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - || { log "CRIU tarball checksum mismatch"; rm -f "$tarball"; exit 1; }
  src="$CACHE/criu-$CRIU_VERSION"
  rm -rf "$src"; mkdir -p "$src"
  tar -xJf "$tarball" -C "$src" --strip-components=1
  for p in "$PATCH_DIR"/*.patch; do
    [ -f "$p" ] || continue
    patch -s -p1 -d "$src" <"$p" || { log "patch $(basename "$p") does not apply"; exit 1; }
  done
  log "building CRIU $CRIU_VERSION (about 30 s)"
  make -C "$src" -j"$(nproc)" RUNDIR="$CRIU_RUNDIR" "${CRIU_MAKE_OPTS[@]}" criu >"$CACHE/criu-build.log" 2>&1 || { log "CRIU build failed, see $CACHE/criu-build.log"; exit 1; }
  install -m 0755 "$src/criu/criu" "$CRIU_BIN"
  build_id >"$CRIU_MARKER"
  rm -rf "$src"
}

# The kerndat cache's tmpfs (gone after a reboot: mounted again here).
if ! mountpoint -q "$CRIU_RUNDIR"; then
  mkdir -p -m 0700 "$CRIU_RUNDIR"
  mount -t tmpfs -o mode=0700,size=4m,nosuid,nodev,noexec ferry-criu "$CRIU_RUNDIR"
fi
# A CRIU killed while saving leaves a .tmp that blocks every later save
# (removing one being written costs that CRIU its save, nothing more).
rm -f "$CRIU_RUNDIR/criu.kdat.tmp"

if ! criu_ok; then
  build_criu
  hash -r
  criu_ok || { log "CRIU $CRIU_VERSION installed at $CRIU_BIN but 'criu check' fails:"; "$CRIU_BIN" check || true; exit 1; }
  log "CRIU $("$CRIU_BIN" --version | awk '/^Version:/ {print $2}') installed at $CRIU_BIN"
fi

# CRIU's own test of inotify watches (zdtm), static, for the e2e
# test that runs it in a migrated container (a few seconds the first time).
ZDTM_DIR="$CACHE/zdtm-$CRIU_VERSION"
ZDTM_TESTS=(inotify02)
if [ ! -x "$ZDTM_DIR/${ZDTM_TESTS[-1]}" ]; then
  work=$(mktemp -d)
  if tar -xJf "$CACHE/criu_${CRIU_VERSION}.orig.tar.xz" -C "$work" --strip-components=1 2>"$CACHE/zdtm-build.log" &&
     make -C "$work/test/zdtm/lib" >>"$CACHE/zdtm-build.log" 2>&1 &&
     make -C "$work/test/zdtm/static" "${ZDTM_TESTS[@]}" LDFLAGS=-static >>"$CACHE/zdtm-build.log" 2>&1; then
    mkdir -p "$ZDTM_DIR"
    for t in "${ZDTM_TESTS[@]}"; do install -m 0755 "$work/test/zdtm/static/$t" "$ZDTM_DIR/$t"; done
    log "CRIU's zdtm tests ${ZDTM_TESTS[*]} built in $ZDTM_DIR"
  else
    log "CRIU's zdtm tests did not build (see $CACHE/zdtm-build.log): the e2e test that runs them will skip"
  fi
  rm -rf "$work"
fi

# A stock CRIU: the same release with none of ferry's patches, for the e2e
# test that a destination whose CRIU lacks them is refused before anything
# is frozen (about 30 s the first time). Its kerndat cache is apart from
# ferry's CRIU's, whose patches may read it differently.
STOCK_CRIU="$CACHE/criu-stock-$CRIU_VERSION/criu"
if [ ! -x "$STOCK_CRIU" ]; then
  work=$(mktemp -d)
  if tar -xJf "$CACHE/criu_${CRIU_VERSION}.orig.tar.xz" -C "$work" --strip-components=1 2>"$CACHE/criu-stock-build.log" &&
     make -C "$work" -j"$(nproc)" RUNDIR=/run/criu-stock "${CRIU_MAKE_OPTS[@]}" criu >>"$CACHE/criu-stock-build.log" 2>&1; then
    mkdir -p "$(dirname "$STOCK_CRIU")"
    install -m 0755 "$work/criu/criu" "$STOCK_CRIU"
    log "a stock CRIU $CRIU_VERSION (no ferry patches) built as $STOCK_CRIU"
  else
    log "the stock CRIU did not build (see $CACHE/criu-stock-build.log): the e2e test that needs it will skip"
  fi
  rm -rf "$work"
fi

# golangci-lint, pinned, for make test's lint step: built from source with
# the installed Go (about two minutes the first time).
LINT_VERSION=2.15.0
if command -v go >/dev/null; then
  LINT_BIN="$(go env GOPATH)/bin/golangci-lint"
  if ! "$LINT_BIN" --version 2>/dev/null | grep -q "version $LINT_VERSION "; then
    log "installing golangci-lint $LINT_VERSION"
    go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v$LINT_VERSION"
  fi
fi

# The lab's Kubernetes cluster (ferry-lab lab up --kubernetes, its tests): one
# binary of Kubernetes' components, etcd, containerd 2.4 and its shim, the
# pause image, built from Go modules into /var/cache/ferry/kube (about ten
# minutes on two cores the first time, a second after).
if command -v go >/dev/null; then
  bash "$(dirname "$0")/kube-build.sh" || { log "the Kubernetes lab's build failed (above)"; exit 1; }
fi

# What the package test (internal/debroot) installs into and from, so
# that make test only copies and packs: a clean Debian 12 root built by
# mmdebstrap from this machine's mirror (about 20 s once, cached in
# $CACHE/debroot by what goes into it; a hidden ferry-lab command checks
# it in well under a second after), and ferry-criu's CRIU as make release
# builds it (a minute when its patches or this script changed, reused
# otherwise). Neither is needed by anything else: a failure is a warning,
# and that test builds or skips.
if command -v go >/dev/null; then
  if ! (cd "$(dirname "$0")/.." && GOTOOLCHAIN=${GOTOOLCHAIN:-auto} go run ./cmd/ferry-lab debroot --quiet >/dev/null); then
    log "the package tests' Debian root did not build (above): they will try again, or skip"
  fi
fi
work=$(mktemp -d)
if ! bash "$(dirname "$0")/release-criu.sh" "$work/criu" 2>"$work/log"; then
  log "ferry-criu's CRIU did not build: $(tail -n 3 "$work/log")"
fi
rm -rf "$work"

cur=$(sysctl -n fs.pipe-max-size)
if [ "$cur" -lt "$PIPE_MAX_MIN" ]; then
  log "raising fs.pipe-max-size from $cur to $PIPE_MAX_SET (CRIU lazy pages need large pipes)"
  sysctl -q -w fs.pipe-max-size=$PIPE_MAX_SET
fi
