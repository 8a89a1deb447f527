#!/usr/bin/env bash
# Runs every benchmark docs/BENCHMARKS.md reports, one after another (they
# share the lab's names), each as its own `ferry-lab bench` command, and keeps
# the JSON in $OUT. Takes about 29 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
F=bin/ferry-lab
run() { local name=$1; shift; echo "bench: $name: $F bench migrate $*" >&2; "$F" bench migrate "$@" --json >"$OUT/$name.json"; }

# Foundation: cold at 100 pages/s against the link and Podman.
run cold-256M-100 --mode cold --memory 256M --dirty-rate 100 --bandwidth 1gbit --repeat 5 --baseline link,podman
# Live migration: every technique at 1,000 pages/s.
for m in cold precopy postcopy hybrid; do
  run "$m-256M-1000" --mode "$m" --memory 256M --dirty-rate 1000 --bandwidth 1gbit --repeat 3 --baseline link
done
# Downtime against memory size: 1 GiB against 256 MiB, alternating in one
# lab (client_downtime_ratio), and post-copy from 64 MiB.
for m in precopy postcopy hybrid; do
  run "$m-256M-vs-1G-1000" --mode "$m" --memory 256M --against-memory 1G --dirty-rate 1000 --bandwidth 1gbit --repeat 3 --baseline link
done
run postcopy-64M-1000 --mode postcopy --memory 64M --dirty-rate 1000 --bandwidth 1gbit --repeat 3
# Pre-copy total time at 100 pages/s.
run precopy-256M-100 --mode precopy --memory 256M --dirty-rate 100 --bandwidth 1gbit --repeat 3 --baseline link
# The runtimes: the same container under runc, containerd and Docker.
for rt in runc containerd docker; do
  for m in cold precopy; do
    run "$rt-$m-256M-100" --runtime "$rt" --mode "$m" --memory 256M --dirty-rate 100 --bandwidth 1gbit --repeat 2
  done
done
# Draining a host: four containers, the line's turn at the commit and at the freeze.
for h in commit freeze; do
  echo "bench: drain-precopy-$h: $F bench drain --mode precopy --handoff $h" >&2
  "$F" bench drain --containers 4 --memory 256M --dirty-rate 100 --bandwidth 1gbit --mode precopy --handoff "$h" >"$OUT/drain-precopy-$h.json"
done
