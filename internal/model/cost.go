package model

import (
	"fmt"
	"math"
)

// The monetary cost model of Yu's MSc thesis (ch. 7) for choosing a
// migration destination among edge servers: one pre-copy iteration, costs
// of CPU, memory, storage and network in euros. Units are made consistent
// here (docs/MODEL.md, "Cost model"):
//   - s_ps and s_pe are read as bytes of checkpoint data one free core
//     processes per second (the thesis says "IPS per core" but divides bytes
//     by them to get seconds in Eqs 7.7-7.11);
//   - Load_c is the cores the container keeps busy, so the CPU term is
//     €/core × cores and Eq 7.3 compares cores with cores:
//     Load_e·NC_e + (s_ps/s_pe)·Load_c ≤ NC_e (the thesis adds a load
//     fraction to Load_c and compares the sum with a core count).
// Both readings give the same euros, so the thesis' worked example (1.64 €)
// still holds.

// CostService is the container to migrate.
type CostService struct {
	DirtyRate   float64 `json:"dirty_rate_pages_per_sec"` // R_dp
	Memory      float64 `json:"memory_bytes"`             // M_c
	Cores       float64 `json:"cores"`                    // Load_c: cores it keeps busy at the source
	StateBytes  float64 `json:"state_bytes"`              // S_nms: state besides memory and network queue
	Compression float64 `json:"compression"`              // R_c: compressed / uncompressed, (0, 1]
	Active      bool    `json:"active"`                   // N_active: a connection is open during migration
	QueueBytes  float64 `json:"queue_bytes"`              // S_n: queued messages moved with the connection
	MaxDowntime float64 `json:"max_downtime_s"`           // T_maxDown; 0 means no limit
}

// CostSource is the host the container leaves.
type CostSource struct {
	PageSize float64 `json:"page_size_bytes"` // S_page
	Load     float64 `json:"load"`            // Load_s, fraction of its CPU in use
	Speed    float64 `json:"speed_bps"`       // s_ps, bytes/s per free core
}

// CostEdge is one candidate destination e.
type CostEdge struct {
	Name        string  `json:"name"`
	Load        float64 `json:"load"`             // Load_e, fraction of its CPU in use
	Cores       float64 `json:"cores"`            // NC_e
	FreeMemory  float64 `json:"free_memory"`      // M_e, bytes
	Bandwidth   float64 `json:"bandwidth_bps"`    // B_se, bytes/s from the source
	Speed       float64 `json:"speed_bps"`        // s_pe, bytes/s per free core
	CPUCost     float64 `json:"cpu_eur_per_core"` // C_CPUe
	CPUOffset   float64 `json:"cpu_offset"`       // O_CPUe
	MemCost     float64 `json:"mem_eur_per_byte"` // C_MEMe
	StorageCost float64 `json:"hdd_eur_per_byte"` // C_HDDe
	NetCost     float64 `json:"net_eur_per_byte"` // C_NETe
}

// CostEstimate is the model evaluated for one destination.
type CostEstimate struct {
	Edge string `json:"edge"`

	Euro     float64 `json:"eur"` // Eq 7.1 for x_e = 1
	CPUEuro  float64 `json:"cpu_eur"`
	DataEuro float64 `json:"data_eur"` // storage + network
	MemEuro  float64 `json:"mem_eur"`

	PreSyncS   float64 `json:"presync_s"`   // Eq 7.7
	DirtyBytes float64 `json:"dirty_bytes"` // D_m, Eq 7.8
	DumpS      float64 `json:"dump_s"`      // Eq 7.9
	DumpSyncS  float64 `json:"dumpsync_s"`  // Eq 7.10
	RestoreS   float64 `json:"restore_s"`   // Eq 7.11
	DowntimeS  float64 `json:"downtime_s"`  // Eq 7.12

	Violations []string `json:"violations,omitempty"` // constraints not met
}

// Feasible reports whether every constraint holds.
func (c CostEstimate) Feasible() bool { return len(c.Violations) == 0 }

// MigrationCost evaluates Eqs 7.1-7.14 with x_e = 1 for edge e.
func MigrationCost(svc CostService, src CostSource, e CostEdge) CostEstimate {
	rc := svc.Compression
	srcRate := (1 - src.Load) * src.Speed // (1 − Load_s)·s_ps
	active := 0.0
	if svc.Active {
		active = 1
	}
	c := CostEstimate{Edge: e.Name}
	// 7.7: compress the pre-dump, then send it.
	c.PreSyncS = svc.Memory/(rc*srcRate) + svc.Memory*rc/e.Bandwidth
	// 7.8: memory dirtied meanwhile.
	c.DirtyBytes = c.PreSyncS * svc.DirtyRate * src.PageSize
	rest := svc.StateBytes + active*svc.QueueBytes + c.DirtyBytes
	c.DumpS = rest / srcRate                                         // 7.9
	c.DumpSyncS = rest/(rc*srcRate) + rest*rc/e.Bandwidth            // 7.10
	c.RestoreS = (rest + svc.Memory) / ((1 - e.Load) * e.Speed * rc) // 7.11
	c.DowntimeS = c.DumpS + c.DumpSyncS + c.RestoreS                 // 7.12

	ratio := src.Speed / e.Speed // s_ps / s_pe
	c.CPUEuro = e.CPUCost * ratio * svc.Cores * (e.Load + e.CPUOffset)
	c.DataEuro = (e.StorageCost + rc*e.NetCost) * (svc.Memory + c.DirtyBytes + active*svc.QueueBytes + svc.StateBytes)
	c.MemEuro = e.MemCost * svc.Memory
	c.Euro = c.CPUEuro + c.DataEuro + c.MemEuro // 7.1

	violate := func(eq, format string, args ...any) {
		c.Violations = append(c.Violations, eq+": "+fmt.Sprintf(format, args...))
	}
	if svc.MaxDowntime > 0 && !(c.DowntimeS <= svc.MaxDowntime) {
		violate("7.2", "downtime %.3g s exceeds %.3g s", c.DowntimeS, svc.MaxDowntime)
	}
	if need := e.Load*e.Cores + ratio*svc.Cores; !(need <= e.Cores) {
		violate("7.3", "needs %.3g of %.3g cores", need, e.Cores)
	}
	if !(svc.Memory <= e.FreeMemory) {
		violate("7.4", "needs %.3g bytes of memory, %.3g free", svc.Memory, e.FreeMemory)
	}
	if !(svc.Memory/c.PreSyncS > svc.DirtyRate*src.PageSize) {
		violate("7.6", "pre-copy (%.3g B/s) does not outrun dirtying (%.3g B/s)",
			svc.Memory/c.PreSyncS, svc.DirtyRate*src.PageSize)
	}
	for _, t := range []float64{c.PreSyncS, c.DumpS, c.DumpSyncS, c.RestoreS, c.DowntimeS} {
		if !(t >= 0) || math.IsInf(t, 0) {
			violate("7.14", "a phase time is not a finite non-negative number (a host at full load or a dead link?)")
			break
		}
	}
	return c
}

// ChooseEdge solves the model by enumeration (Eq 7.5: exactly one
// destination): the feasible edge with the lowest cost, or -1 when none is
// feasible. all holds every edge's estimate, in order.
func ChooseEdge(svc CostService, src CostSource, edges []CostEdge) (best int, all []CostEstimate) {
	best = -1
	for i, e := range edges {
		c := MigrationCost(svc, src, e)
		all = append(all, c)
		if c.Feasible() && (best < 0 || c.Euro < all[best].Euro) {
			best = i
		}
	}
	return best, all
}
