#!/usr/bin/env bash
# Builds ferry's CRIU for the ferry-criu package (make release): CRIU from
# Debian's source tarball, which scripts/setup.sh fetched into its cache,
# with scripts/criu-patches/*.patch applied, built as setup builds it (the
# version, checksum, run directory and make options are read from
# setup.sh, so the two never differ), then stripped.
#
#   scripts/release-criu.sh OUT
#
# writes OUT/criu, OUT/depends (the runtime libraries' Debian packages, one
# a line, from dpkg-shlibdeps), OUT/COPYING, OUT/patches/ and OUT/README.
# The build runs outside the repository (CRIU's Makefile asks git for a
# version when it finds a .git), in a directory named by what goes into it,
# so a second release with the same patches reuses it. Debian only, for
# the machine's own architecture.
set -euo pipefail

log() { printf 'release-criu: %s\n' "$*" >&2; }

# The build sees nothing of its caller's build settings (a make's flags,
# a Go build's LDFLAGS): the same sources give the same binary.
unset CFLAGS CPPFLAGS LDFLAGS MAKEFLAGS MFLAGS GNUMAKEFLAGS MAKELEVEL MAKEFILES

out=${1:?usage: release-criu.sh OUT}
here="$(cd "$(dirname "$0")" && pwd)"
setup="$here/setup.sh"
patches="$here/criu-patches"

# The four settings setup.sh builds CRIU with.
eval "$(grep -E '^(CRIU_VERSION|CRIU_SHA256|CRIU_RUNDIR|CRIU_MAKE_OPTS)=' "$setup")"
: "${CRIU_VERSION:?not found in $setup}" "${CRIU_SHA256:?not found in $setup}" "${CRIU_RUNDIR:?not found in $setup}"

cache=${FERRY_CACHE:-/var/cache/ferry}
tarball="$cache/criu_${CRIU_VERSION}.orig.tar.xz"
if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
  log "no CRIU $CRIU_VERSION source at $tarball (or a wrong one): make setup fetches it"
  exit 1
fi

# CRIU stamps its build time into its kernel-feature cache's magic (a new
# binary does not trust an old cache) unless SOURCE_DATE_EPOCH says it:
# the time of the last commit that changed what goes into it.
epoch=$(git -C "$here" log -1 --format=%ct -- criu-patches setup.sh 2>/dev/null || true)
export SOURCE_DATE_EPOCH=${epoch:-${SOURCE_DATE_EPOCH:?not a git clone: set SOURCE_DATE_EPOCH}}
id=$( { echo "$CRIU_VERSION rundir=$CRIU_RUNDIR ${CRIU_MAKE_OPTS[*]} epoch=$SOURCE_DATE_EPOCH"; cat "$patches"/*.patch; } | sha256sum | cut -c1-16)
build="${CRIU_RELEASE_BUILD:-$cache/release-criu}/$id"
src="$build/criu-$CRIU_VERSION"
if [ ! -x "$build/criu" ]; then
  rm -rf "$build"
  mkdir -p "$src"
  tar -xJf "$tarball" -C "$src" --strip-components=1
  for p in "$patches"/*.patch; do
    patch -s -p1 -d "$src" <"$p" || { log "patch $(basename "$p") does not apply"; exit 1; }
  done
  log "building CRIU $CRIU_VERSION with ${#CRIU_MAKE_OPTS[@]} option(s) and $(ls "$patches"/*.patch | wc -l) patches in $src (about a minute)"
  # The source directory's path does not enter the binary.
  if ! make -C "$src" -j"$(nproc)" RUNDIR="$CRIU_RUNDIR" "${CRIU_MAKE_OPTS[@]}" \
      USERCFLAGS="-ffile-prefix-map=$src=." criu >"$build/build.log" 2>&1; then
    log "CRIU build failed, see $build/build.log (make setup installs its build dependencies)"
    exit 1
  fi
  strip --strip-unneeded -o "$build/criu.tmp" "$src/criu/criu"
  mv "$build/criu.tmp" "$build/criu"
fi

rm -rf "$out"
mkdir -p "$out/patches"
install -m 0755 "$build/criu" "$out/criu"
install -m 0644 "$src/COPYING" "$out/COPYING"
install -m 0644 "$patches"/*.patch "$out/patches/"

# The libraries it links, as Debian packages with their lowest versions.
shl=$(mktemp -d)
trap 'rm -rf "$shl"' EXIT
mkdir "$shl/debian"
printf 'Source: ferry-criu\n\nPackage: ferry-criu\nArchitecture: any\n' >"$shl/debian/control"
deps=$(cd "$shl" && dpkg-shlibdeps -O "$out/criu" 2>/dev/null) || { log "dpkg-shlibdeps failed on $out/criu"; exit 1; }
deps=${deps#shlibs:Depends=}
printf '%s\n' "$deps" | sed 's/, /\n/g' >"$out/depends"

{
  echo "ferry's CRIU"
  echo
  echo "CRIU $CRIU_VERSION (https://criu.org), built from Debian's source tarball"
  echo "criu_${CRIU_VERSION}.orig.tar.xz (SHA-256 $CRIU_SHA256)"
  echo "with the patches in patches/, applied in their order:"
  echo
  for p in "$patches"/*.patch; do echo "  $(basename "$p")"; done
  echo
  echo "Built with: make RUNDIR=$CRIU_RUNDIR ${CRIU_MAKE_OPTS[*]} criu"
  echo "It keeps its kernel-feature cache in $CRIU_RUNDIR, a tmpfs that ferry's"
  echo "run-criu.mount unit mounts. ferry runs it from /usr/libexec/ferry/criu;"
  echo "it is not on PATH and leaves any other CRIU on the host alone."
} >"$out/README"
log "$out/criu: $(tr '\n' ' ' <"$out/depends")"
