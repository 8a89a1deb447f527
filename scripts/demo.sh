#!/usr/bin/env bash
# make demo: a live migration between two emulated hosts, with its KPIs and
# what a client of the workload saw.
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY=$PWD/bin/ferry
FERRY_LAB=$PWD/bin/ferry-lab # the lab; its agents run bin/ferry
# ferry names the lab's hosts (h1, h2) from its state file, when told.
export FERRY_HOSTS=/run/ferry/lab/state.json
say() { printf 'demo: %s\n' "$*"; }

work=$(mktemp -d)
cleanup() {
  exec 3>&- 2>/dev/null || true
  [ -n "${probe_pid:-}" ] && kill "$probe_pid" 2>/dev/null || true
  "$FERRY_LAB" lab down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$FERRY" check >/dev/null || { "$FERRY" check; exit 1; }
"$FERRY_LAB" lab down >/dev/null
say "a lab of 3 emulated hosts (network namespaces on a bridge), links shaped to 1 Gbit/s"
"$FERRY_LAB" lab up --hosts 3 --bandwidth 1gbit
say "memhog on h1: 256 MiB of random data, dirtying 100 pages/s, answering a client on h3"
"$FERRY_LAB" lab run h1 hog -- /bin/memhog --memory 256M --dirty-rate 100 --port 7000

# The client lives in h3: lab addresses exist only inside the lab.
# migrate_watched FROM TO MODE: one migration with the client polling.
migrate_watched() {
  rm -f "$work/in" "$work/out"
  mkfifo "$work/in"
  nsenter --net=/var/run/netns/ferry-h3 -- "$FERRY_LAB" lab-tool probe \
    --addr 10.77.0.1:7000 --addr 10.77.0.2:7000 <"$work/in" >"$work/out" &
  probe_pid=$!
  exec 3>"$work/in"
  for _ in $(seq 600); do [ -s "$work/out" ] && break; sleep 0.1; done
  [ -s "$work/out" ] || { say "memhog did not become ready"; exit 1; }
  sleep 1
  say "ferry migrate hog --from $1 --to $2 --mode $3"
  "$FERRY" migrate hog --from "$1" --to "$2" --mode "$3"
  exec 3>&-
  wait "$probe_pid" || true
  probe_pid=
  python3 - "$work/out" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
r = json.loads(lines[1])
print(f"demo: the client saw the workload silent for {r['client_downtime_ms']:.0f} ms at most; "
      f"its state checks: {str(r['state_ok']).lower()}" + (f" ({r['reason']})" if r.get('reason') else ""))
PY
}

say "memhog is filling its memory; a client on h3 will poll it every 5 ms"
migrate_watched h1 h2 cold
say "and back, live: pre-copy rounds while it runs, then post-copy for the rest"
migrate_watched h2 h1 hybrid
"$FERRY_LAB" lab status
