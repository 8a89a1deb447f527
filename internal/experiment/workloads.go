package experiment

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// workload is what a grid point's container runs.
type workload struct {
	// service is nil for memhog, which ferry's bench runs and probes.
	service *service
}

// service is a real server from Debian's packages, in a root filesystem
// of its own, with an address of its own on the lab's service segment,
// loaded by `ferry-lab lab-tool load` from the client host.
type service struct {
	// packages make its root filesystem (lab.RunOptions.Packages).
	packages []string
	port     int
	// client is the lab-tool load client's --service; tool says whether
	// it can run the service's own benchmark beside (--tool).
	client string
	tool   bool
	// command starts the server holding about state bytes.
	command func(state int64) []string
}

// workloads are the grid's workload names.
var workloads = map[string]workload{
	"memhog": {},
	"redis": {service: &service{packages: []string{"redis-server"}, port: 6379, client: "redis", tool: true,
		command: func(int64) []string {
			return []string{"redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--port", "6379"}
		}}},
	"memcached": {service: &service{packages: []string{"memcached"}, port: 11211, client: "memcached",
		command: func(state int64) []string {
			// Room for the state and the load's keys, so nothing is evicted.
			mb := 2*state>>20 + 64
			return []string{"memcached", "-u", "memcache", "-p", "11211", "-U", "0", "-m", fmt.Sprint(mb)}
		}}},
	"mosquitto": {service: &service{packages: []string{"mosquitto"}, port: 1883, client: "mqtt", tool: true,
		command: func(int64) []string {
			// Mosquitto 2 listens on loopback alone unless told.
			return shell(`printf 'listener 1883 0.0.0.0\nallow_anonymous true\npersistence false\n' > /run/mosquitto.conf && exec mosquitto -c /run/mosquitto.conf`)
		}}},
	"postgresql": {service: &service{packages: []string{"postgresql-15"}, port: 5432, client: "postgres", tool: true,
		command: func(state int64) []string {
			// A cluster of its own in the container's root filesystem (it
			// moves with it), trusting the lab's segment, with shared
			// buffers that hold the state.
			buffers := max(128, 2*state>>20)
			return shell(fmt.Sprintf(`set -e
d=/var/lib/ferry-pg; bin=/usr/lib/postgresql/15/bin
mkdir -p $d /run/postgresql && chown postgres:postgres $d /run/postgresql
as() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
as $bin/initdb -D $d -A trust -U postgres >/dev/null
echo "host all all 0.0.0.0/0 trust" >> $d/pg_hba.conf
exec setpriv --reuid=postgres --regid=postgres --init-groups $bin/postgres -D $d -c listen_addresses='*' -c shared_buffers=%dMB`, buffers))
		}}},
}

func shell(script string) []string { return []string{"/bin/sh", "-c", script} }

// WorkloadNames lists the workloads a spec may name.
func WorkloadNames() string {
	return strings.Join(slices.Sorted(maps.Keys(workloads)), ", ")
}
