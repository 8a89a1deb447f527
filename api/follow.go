package api

// What following a service's clients asks of agents (ferry follow): the
// source agent's view of the service and of each candidate host
// (ChanAssess), and a destination's reservation of room for the move
// (ChanReserve).
const (
	// ChanAssess: a client asks the container's agent how far its
	// clients are and what moving it to each candidate would take
	// (AssessQuery -> Assessment).
	ChanAssess = "assess"
	// ChanReserve: a client reserves room on a destination for a
	// migration it is about to ask for, or releases it (Reservation ->
	// ReserveReply).
	ChanReserve = "reserve"
)

// AssessQuery asks the agent running Container about it and about the
// hosts it could move to.
type AssessQuery struct {
	Container string `json:"container"`
	Runtime   string `json:"runtime,omitempty"` // "" or RuntimeAuto: every runtime present
	// Ports are the container's listening ports whose connections are its
	// clients (none: every established connection).
	Ports []int `json:"ports,omitempty"`
	// Probe is an address to measure instead, for a service without
	// long-lived connections (HOST, or HOST:PORT for a TCP probe).
	Probe string `json:"probe,omitempty"`
	// Candidates are the hosts' agents (peer addresses, HOST:PORT) to ask
	// for their own latency to the clients, their room and prices, and
	// to measure the link to.
	Candidates []string `json:"candidates,omitempty"`
	// Workload also measures the container (a second of its memory and
	// CPU), as a decision needs; a latency sample alone does not.
	Workload bool `json:"workload,omitempty"`
	// ProbeSeconds spreads each candidate's probes of the clients over
	// this long (0: a fraction of a second), so that its latency is a
	// median over about as long as the service's own was judged.
	ProbeSeconds float64 `json:"probe_s,omitempty"`
	// NoClients skips the clients (a move not made for them: a node
	// chosen for a Migration that names none).
	NoClients bool `json:"no_clients,omitempty"`
}

// Client is one of the service's clients, by address.
type Client struct {
	Addr string `json:"addr"`
	// Conns is how many of its connections were seen (0: measured by a
	// probe).
	Conns int `json:"conns,omitempty"`
	// RTTMs is its round-trip time as the host measured it: the kernel's
	// smoothed RTT of its connections, or a probe's median.
	RTTMs float64 `json:"rtt_ms"`
}

// Assessment is the source agent's answer.
type Assessment struct {
	Host      string `json:"host"`
	Container string `json:"container"`
	Runtime   string `json:"runtime"`
	// Clients and LatencyMs: the clients and their latency to the
	// service (the mean over clients, weighted by connections).
	Clients   []Client `json:"clients"`
	LatencyMs float64  `json:"latency_ms"`
	// ProbedLatencyMs, when candidates were asked, is this host's own
	// probe of the same clients, made as the candidates make theirs (the
	// same count, spread and kind), so that they compare like with like.
	ProbedLatencyMs float64 `json:"probed_latency_ms,omitempty"`
	// The workload, measured over a second when asked (Workload):
	// resident memory, pages written a second, shared memory, and the CPU
	// cores it kept busy.
	MemoryBytes int64   `json:"memory_bytes"`
	DirtyRate   float64 `json:"dirty_rate"`
	SharedBytes int64   `json:"shared_bytes,omitempty"`
	Cores       float64 `json:"cores"`
	// StateBytes is what moves besides memory: the files of its root
	// filesystem that move (its own layer, or the whole tree) and its
	// volumes.
	StateBytes int64 `json:"state_bytes,omitempty"`
	// KeepsAddress: its address moves with it (handed over at the
	// freeze). NoLazyRestore and CopiesImages: what its runtime can do
	// here (the planner's inputs).
	KeepsAddress  bool `json:"keeps_address,omitempty"`
	NoLazyRestore bool `json:"no_lazy_restore,omitempty"`
	CopiesImages  bool `json:"copies_images,omitempty"`
	// Load is this host's: the room it has left, for the source's own
	// terms of the cost model.
	Load HostLoad `json:"load"`
	// Candidates answer in the order asked.
	Candidates []CandidateView `json:"candidates"`
}

// HostLoad is what a host has and can give.
type HostLoad struct {
	Cores       float64 `json:"cores"`
	BusyCores   float64 `json:"busy_cores"`
	FreeMemory  int64   `json:"free_memory_bytes"`  // available, less what is reserved
	FreeStorage int64   `json:"free_storage_bytes"` // on the agent's state directory's filesystem
	// ReservedMemory and ReservedCores are held for migrations on their
	// way (already taken off the free figures).
	ReservedMemory int64   `json:"reserved_memory_bytes,omitempty"`
	ReservedCores  float64 `json:"reserved_cores,omitempty"`
}

// Costs are a host's unit prices for hosting a container, the thesis'
// cost model's (from its agent's --cost-* settings).
type Costs struct {
	CPUEurPerCore     float64 `json:"cpu_eur_per_core"`     // C_CPU
	CPUOffset         float64 `json:"cpu_offset"`           // O_CPU
	MemEurPerByte     float64 `json:"mem_eur_per_byte"`     // C_MEM
	StorageEurPerByte float64 `json:"storage_eur_per_byte"` // C_HDD
	NetEurPerByte     float64 `json:"net_eur_per_byte"`     // C_NET
}

// CandidateView is one candidate host as the source agent found it.
type CandidateView struct {
	Addr string `json:"addr"`
	Host string `json:"host,omitempty"`
	// Error says why the host could not be asked or measured.
	Error string `json:"error,omitempty"`
	// Clients are its own round trips to the service's clients (a probe's
	// median each), and LatencyMs their mean weighted as the source's.
	Clients   []Client `json:"clients,omitempty"`
	LatencyMs float64  `json:"latency_ms"`
	Load      HostLoad `json:"load"`
	Costs     Costs    `json:"costs"`
	// ThroughputBps is what the link from the source carried, bits a
	// second, and RTTMs its round trip (the median of TCP handshakes with
	// the candidate's agent).
	ThroughputBps float64 `json:"throughput_bps"`
	RTTMs         float64 `json:"rtt_ms"`
}

// CandidateQuery is what a source agent asks a candidate host (a peer
// request): its round trips to these client addresses.
type CandidateQuery struct {
	Clients []string `json:"clients"`
	// ProbeSeconds: as AssessQuery's.
	ProbeSeconds float64 `json:"probe_s,omitempty"`
}

// CandidateReply is a candidate host's answer.
type CandidateReply struct {
	Host    string   `json:"host"`
	Clients []Client `json:"clients"`
	Load    HostLoad `json:"load"`
	Costs   Costs    `json:"costs"`
}

// Reservation holds room on a destination for one migration, named by
// the ID the caller will give the migration (Request.ID): the incoming
// migration of that ID takes it, and it ends with the migration or when
// it expires unused.
type Reservation struct {
	ID          string  `json:"id"`
	Container   string  `json:"container"`
	MemoryBytes int64   `json:"memory_bytes"`
	Cores       float64 `json:"cores"`
	// TTLSeconds: how long it is held unused (0: the agent's default).
	TTLSeconds float64 `json:"ttl_s,omitempty"`
	// Release gives the room back at once (a move called off).
	Release bool `json:"release,omitempty"`
}

// ReserveReply accepts or refuses a reservation.
type ReserveReply struct {
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	// Load is the host's after the reservation.
	Load HostLoad `json:"load"`
}
