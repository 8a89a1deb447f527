#!/usr/bin/env bash
# Builds what ferry's Kubernetes lab (internal/kubelab) runs, from Go
# modules, into a cache outside the repository:
#
#   $CACHE/bin/ferry-kube                 kube-apiserver, kube-controller-manager,
#                                         kube-scheduler and kubelet in one binary
#                                         (tools/kube), plus `ferry-kube image`
#   $CACHE/bin/etcd                       etcd (tools/kube/etcd)
#   $CACHE/bin/containerd, containerd-shim-runc-v2, ctr
#   $CACHE/bin/containerd-shim-ferry-v2   the runc shim that restores a migrated
#                                         container's replacement (tools/kube/shim)
#   $CACHE/cni/                           CNI plugins: bridge, host-local, loopback
#   $CACHE/images/pause.tar               the pod sandbox image, OCI image layout
#   $CACHE/stamp                          what each output was built from
#
# Idempotent: a step whose outputs exist and whose stamp line matches is
# skipped, so a second run takes seconds; a changed version (or a changed
# tools/kube source, or another Go) rebuilds that step alone. Every step's
# output goes to $CACHE/logs/STEP.log.
#
# Timing-sensitive benchmarks share this machine: a heavy build waits
# while `ferry-lab bench` runs (polling every 20 s, at most 25 minutes), is
# paused if one starts meanwhile (again at most 25 minutes), and runs at
# low CPU priority.
set -euo pipefail

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.10.0    # built only when the system's plugins will not do
PAUSE_TAG=3.10.2       # the kubelet's and containerd's default sandbox image
PAUSE_REF=registry.k8s.io/pause:$PAUSE_TAG
SYSTEM_CNI=/usr/lib/cni
CNI_PLUGINS=(bridge host-local loopback)

CACHE=${FERRY_KUBE_CACHE:-/var/cache/ferry/kube}
BIN=$CACHE/bin
LOGS=$CACHE/logs
STAMP=$CACHE/stamp
REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_WAIT_MAX=$((25 * 60))
BENCH_POLL=20

export PATH=/usr/local/go/bin:$PATH
export GOFLAGS=-buildvcs=false
GO_VERSION=$(go env GOVERSION)

say() { printf 'kube-build: %s\n' "$*" >&2; }

# stamp_get KEY prints the recorded value of KEY.
stamp_get() { [ -f "$STAMP" ] && sed -n "s/^$1=//p" "$STAMP" | head -n1 || true; }

# stamp_set KEY VALUE records KEY's value, replacing the old line.
stamp_set() {
  local tmp
  tmp=$(mktemp "$CACHE/.stamp.XXXXXX")
  { [ -f "$STAMP" ] && grep -v "^$1=" "$STAMP" || true; printf '%s=%s\n' "$1" "$2"; } > "$tmp"
  mv "$tmp" "$STAMP"
}

# hash_files prints one digest of the named files' contents and names.
hash_files() { (cd "$REPO" && sha256sum "$@") | sha256sum | cut -c1-16; }

# wait_for_bench holds a heavy build while a ferry benchmark runs: builds
# take both cores for minutes and would skew its timings.
wait_for_bench() {
  local waited=0
  while pgrep -f 'ferry-lab bench' >/dev/null; do
    if [ "$waited" -ge "$BENCH_WAIT_MAX" ]; then
      say "a 'ferry-lab bench' is still running after $((waited / 60)) min; building anyway"
      return
    fi
    [ "$waited" -gt 0 ] || say "waiting for the running 'ferry-lab bench' to end (up to $((BENCH_WAIT_MAX / 60)) min)"
    sleep "$BENCH_POLL"
    waited=$((waited + BENCH_POLL))
  done
  [ "$waited" -eq 0 ] || say "benchmark ended; waited ${waited}s"
}

# signal_tree SIG PID sends SIG to PID and all its descendants, parents
# first (a stopped parent starts no new child meanwhile).
signal_tree() {
  local sig=$1 pid=$2 child
  kill -s "$sig" "$pid" 2>/dev/null || return 0
  for child in $(pgrep -P "$pid"); do signal_tree "$sig" "$child"; done
}

# pause_for_bench PID FILE: while PID (a heavy step) runs, stops it
# whenever a `ferry-lab bench` starts and continues it when that ends, for at
# most BENCH_WAIT_MAX in all (benchmarks run one after another, and a
# build that started between two of them would skew the next); FILE gets
# the seconds paused.
pause_for_bench() {
  local pid=$1 file=$2 paused="" waited=0
  echo 0 > "$file"
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -lt "$BENCH_WAIT_MAX" ] && pgrep -f 'ferry-lab bench' >/dev/null; then
      [ -n "$paused" ] || { signal_tree STOP "$pid"; paused=1; say "paused while a 'ferry-lab bench' runs"; }
      waited=$((waited + 5))
      echo "$waited" > "$file"
    elif [ -n "$paused" ]; then
      signal_tree CONT "$pid"; paused=""
      say "resumed (${waited}s paused so far)"
    fi
    sleep 5
  done
}

# step NAME STAMP-VALUE OUTPUTS FUNCTION [heavy]: runs FUNCTION, its
# output in $LOGS/NAME.log, unless every path in OUTPUTS (space-separated)
# exists and NAME's stamp is STAMP-VALUE. A heavy step first waits for
# benchmarks to end, and pauses while one runs.
step() {
  local name=$1 want=$2 outputs=$3 fn=$4 heavy=${5:-} out missing=""
  for out in $outputs; do [ -e "$out" ] || missing=1; done
  if [ -z "$missing" ] && [ "$(stamp_get "$name")" = "$want" ]; then
    say "$name: up to date"
    return
  fi
  [ -z "$heavy" ] || wait_for_bench
  local log=$LOGS/$name.log start=$SECONDS rc pid watcher="" paused=0
  say "$name: building ($want)"
  # A subshell of its own: errexit holds inside it (it would not in a
  # function called from an if), and its cd stays there.
  (set -e; "$fn") > "$log" 2>&1 &
  pid=$!
  if [ -n "$heavy" ]; then
    pause_for_bench "$pid" "$LOGS/$name.paused" &
    watcher=$!
  fi
  set +e
  wait "$pid"
  rc=$?
  set -e
  if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    paused=$(cat "$LOGS/$name.paused" 2>/dev/null || echo 0)
    rm -f "$LOGS/$name.paused"
  fi
  if [ "$rc" -ne 0 ]; then
    say "$name: FAILED (exit $rc) after $((SECONDS - start))s; log: $log"
    tail -n 20 "$log" | sed 's/^/    /' >&2
    exit 1
  fi
  stamp_set "$name" "$want"
  if [ "$paused" -gt 0 ]; then
    say "$name: done in $((SECONDS - start - paused))s of work (and ${paused}s paused for benchmarks)"
  else
    say "$name: done in $((SECONDS - start))s"
  fi
}

build_ferry_kube() {
  local pkg ldflags=(-s -w)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    # The apiserver and the kubelet compare versions (skew checks, the
    # node's reported kubelet version), so the binary must say which it is.
    ldflags+=(
      "-X=$pkg.gitVersion=$KUBE_VERSION"
      "-X=$pkg.gitMajor=$(echo "$KUBE_VERSION" | cut -d. -f1 | tr -d v)"
      "-X=$pkg.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
      "-X=$pkg.gitCommit="
      "-X=$pkg.gitTreeState=clean"
      "-X=$pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    )
  done
  cd "$REPO/tools/kube"
  CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "${ldflags[*]}" -o "$BIN/ferry-kube.new" .
  mv "$BIN/ferry-kube.new" "$BIN/ferry-kube"
  "$BIN/ferry-kube" kubelet --version
}

build_etcd() {
  cd "$REPO/tools/kube/etcd"
  CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags '-s -w' -o "$BIN/etcd.new" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.new" "$BIN/etcd"
  "$BIN/etcd" --version
}

build_containerd() {
  local cmd
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    GOBIN=$BIN nice -n 10 go install -tags no_btrfs -trimpath \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION"
  done
  "$BIN/containerd" --version
}

# build_shim builds ferry's shim: containerd's runc shim, with the
# restore wrapper, from the containerd that tools/kube/shim's go.mod
# requires, which must be $CONTAINERD_VERSION (the shim talks to that
# containerd).
build_shim() {
  local have
  cd "$REPO/tools/kube/shim"
  have=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
  if [ "$have" != "$CONTAINERD_VERSION" ]; then
    echo "tools/kube/shim/go.mod requires containerd $have, not $CONTAINERD_VERSION: update it (go get, go mod tidy)"
    return 1
  fi
  CGO_ENABLED=0 nice -n 10 go build -tags no_btrfs -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -o "$BIN/containerd-shim-ferry-v2.new" .
  mv "$BIN/containerd-shim-ferry-v2.new" "$BIN/containerd-shim-ferry-v2"
  "$BIN/containerd-shim-ferry-v2" -v
}

# system_cni_usable: the system's plugins speak the CNI spec version the
# lab's network config uses (1.0.0), which containerd 2.4.2 (libcni 1.3)
# drives as it is.
system_cni_usable() {
  local p
  for p in "${CNI_PLUGINS[@]}"; do
    [ -x "$SYSTEM_CNI/$p" ] || return 1
    CNI_COMMAND=VERSION "$SYSTEM_CNI/$p" </dev/null 2>/dev/null | grep -q '"1\.0\.0"' || return 1
  done
}

cni_source() { if system_cni_usable; then echo "system $SYSTEM_CNI"; else echo "built $CNI_VERSION"; fi; }

install_cni() {
  local p
  rm -rf "$CACHE/cni.new" && mkdir -p "$CACHE/cni.new"
  if system_cni_usable; then
    for p in "${CNI_PLUGINS[@]}"; do
      ln -s "$SYSTEM_CNI/$p" "$CACHE/cni.new/$p"
      CNI_COMMAND=VERSION "$SYSTEM_CNI/$p" </dev/null; echo
    done
  else
    for p in "${CNI_PLUGINS[@]}"; do
      local dir=main
      [ "$p" = host-local ] && dir=ipam
      GOBIN=$CACHE/cni.new CGO_ENABLED=0 nice -n 10 go install -trimpath -ldflags '-s -w' \
        "github.com/containernetworking/plugins/plugins/$dir/$p@$CNI_VERSION"
    done
  fi
  rm -rf "$CACHE/cni" && mv "$CACHE/cni.new" "$CACHE/cni"
}

build_pause() {
  local src
  src=$(cd "$REPO/tools/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  [ -f "$src" ] || { echo "no pause.c at $src"; return 1; }
  mkdir -p "$CACHE/images" "$CACHE/pause.build"
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-ferry" -o "$CACHE/pause.build/pause" "$src"
  strip "$CACHE/pause.build/pause"
  "$BIN/ferry-kube" image --ref "$PAUSE_REF" --out "$CACHE/images/pause.tar" "$CACHE/pause.build/pause"
  rm -rf "$CACHE/pause.build"
  tar -tvf "$CACHE/images/pause.tar"
}

main() {
  mkdir -p "$BIN" "$LOGS"
  local total=$SECONDS
  if ! (cd "$REPO/tools/kube" && go mod download k8s.io/kubernetes) > "$LOGS/modules.log" 2>&1; then
    say "modules: FAILED to download k8s.io/kubernetes $KUBE_VERSION; log: $LOGS/modules.log"
    exit 1
  fi
  local kube_src cni_heavy=heavy
  kube_src=$(hash_files tools/kube/go.mod tools/kube/go.sum tools/kube/*.go tools/kube/ociimage/*.go)
  step ferry-kube "$KUBE_VERSION $GO_VERSION src:$kube_src" "$BIN/ferry-kube" build_ferry_kube heavy
  step etcd "$ETCD_VERSION $GO_VERSION src:$(hash_files tools/kube/etcd/go.mod tools/kube/etcd/go.sum)" \
    "$BIN/etcd" build_etcd heavy
  step containerd "$CONTAINERD_VERSION $GO_VERSION no_btrfs" \
    "$BIN/containerd $BIN/containerd-shim-runc-v2 $BIN/ctr" build_containerd heavy
  step ferry-shim "$CONTAINERD_VERSION $GO_VERSION src:$(hash_files tools/kube/shim/go.mod tools/kube/shim/go.sum \
    tools/kube/shim/*.go tools/kube/shim/restore/*.go api/restoreshim/*.go)" \
    "$BIN/containerd-shim-ferry-v2" build_shim heavy
  if system_cni_usable; then cni_heavy=""; fi
  step cni "$(cni_source)" "$CACHE/cni/bridge $CACHE/cni/host-local $CACHE/cni/loopback" install_cni $cni_heavy
  # ferry-kube packs the image: a rebuilt ferry-kube repacks it.
  step pause "$PAUSE_REF pause.c of $KUBE_VERSION packer:$kube_src" "$CACHE/images/pause.tar" build_pause
  say "all in $CACHE (this run: $((SECONDS - total))s)"
}

main "$@"
