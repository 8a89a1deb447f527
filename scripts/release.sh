#!/usr/bin/env bash
# make release: every release artifact into $DIST, from the commit checked
# out, the same bytes each time (SOURCE_DATE_EPOCH is the commit's time):
#
#   ferry-V-linux-ARCH, ferry-controller-V-linux-ARCH   static binaries
#   ferry-V-linux-ARCH.cdx.json, ferry-controller-...    their SBOMs (CycloneDX)
#   ferry_V_ARCH.deb                                     the package
#   ferry-criu_V_amd64.deb                               ferry's CRIU (amd64 only)
#   ferry-V-linux-ARCH.tar.gz                            binaries, man pages,
#                                                        completion, units, example config
#   SHA256SUMS
#
# V is the Debian version of git describe (tools/package version). The
# Makefile passes GO, VERSION, GO_LDFLAGS, CONTROLLER_LDFLAGS, BIN, DIST,
# RELEASE_ARCHES and SOURCE_DATE_EPOCH.
set -euo pipefail

log() { printf 'release: %s\n' "$*" >&2; }

: "${GO:=go}" "${BIN:=bin}" "${DIST:=dist}" "${RELEASE_ARCHES:=amd64 arm64}"
: "${VERSION:?}" "${GO_LDFLAGS:?}" "${CONTROLLER_LDFLAGS:?}"
: "${SOURCE_DATE_EPOCH:?the commit time: make release sets it}"
export SOURCE_DATE_EPOCH
root=$(pwd)
BIN=$(realpath -m "$BIN")
DIST=$(realpath -m "$DIST")
stage="$BIN/release"
tool="$stage/ferry-package"

case "$VERSION" in *-dirty) log "warning: the work tree has changes: $VERSION is no commit's release" ;; esac

rm -rf "$DIST" "$stage"
mkdir -p "$DIST" "$stage"
(cd tools/package && "$GO" build -trimpath -o "$tool" .)
V=$("$tool" version "$VERSION")
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
log "version $VERSION, as a Debian version $V; files dated $(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)"

# The binaries: static, without the build's paths, named by the ldflags
# (version and commit, as make build does). Not stamped by the go command
# (-buildvcs=false): it stamps from a clone but not from a git worktree or
# an exported tree, and counts untracked files as changes, so the same
# commit would give different bytes; the SBOMs name the commit instead.
host=$("$GO" env GOHOSTARCH)
for arch in $RELEASE_ARCHES; do
  mkdir -p "$stage/$arch"
  log "building ferry and ferry-controller for linux/$arch"
  if ! GOOS=linux GOARCH=$arch CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$GO_LDFLAGS" -o "$stage/$arch/ferry" ./cmd/ferry ||
     ! GOOS=linux GOARCH=$arch CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$CONTROLLER_LDFLAGS" -o "$stage/$arch/ferry-controller" ./cmd/ferry-controller; then
    log "ferry does not build for linux/$arch (above); RELEASE_ARCHES=\"${RELEASE_ARCHES/$arch/}\" leaves it out"
    exit 1
  fi
done

# Man pages and completion are the same for every architecture: made by
# a ferry that runs here (dated SOURCE_DATE_EPOCH).
runner="$stage/$host/ferry"
if [ ! -x "$runner" ]; then
  mkdir -p "$stage/host"
  runner="$stage/host/ferry"
  CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$GO_LDFLAGS" -o "$runner" ./cmd/ferry
fi
"$runner" man --dir "$stage/share/man" >/dev/null
mkdir -p "$stage/share/completion"
"$runner" completion bash >"$stage/share/completion/ferry.bash"

for arch in $RELEASE_ARCHES; do
  a="$stage/$arch"
  cp -r "$stage/share/man" "$stage/share/completion" "$a/"
  for b in ferry ferry-controller; do
    cp "$a/$b" "$DIST/$b-$V-linux-$arch"
    "$tool" sbom --name "$b" --version "$VERSION" --commit "$commit" "$a/$b" "$DIST/$b-$V-linux-$arch.cdx.json" >/dev/null
  done
  "$tool" deb --root "$root" --arch "$arch" --version "$VERSION" --var BIN="$a" --out "$DIST" >/dev/null
  "$tool" tarball --root "$root" --arch "$arch" --version "$VERSION" --bin "$a" --out "$DIST" >/dev/null
done

# ferry-criu: CRIU is C, built here with the host's compiler and
# libraries, so only for the host's own architecture.
deb_host=$(dpkg --print-architecture 2>/dev/null || echo none)
for arch in $RELEASE_ARCHES; do
  if [ "$arch" != "$deb_host" ]; then
    log "no ferry-criu for $arch: CRIU is built with the host's C compiler and libraries ($deb_host), and this host has no $arch cross toolchain nor $arch libraries (dpkg --add-architecture $arch, crossbuild-essential-$arch and CRIU's build dependencies for $arch would be needed). ferry_${V}_$arch.deb needs a criu (>= 4.2.1) from elsewhere."
    continue
  fi
  log "building ferry-criu for $arch"
  scripts/release-criu.sh "$stage/criu-$arch"
  "$tool" deb --root "$root" --config packaging/nfpm-criu.yaml --arch "$arch" --version "$VERSION" \
    --var CRIU="$stage/criu-$arch" --depends "$stage/criu-$arch/depends" --out "$DIST" >/dev/null
done

"$tool" sums "$DIST" >/dev/null
log "in $DIST:"
(cd "$DIST" && ls -l --time-style=+ | tail -n +2 | awk '{printf "  %10s  %s\n", $5, $NF}') >&2
