package model

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// The thesis' worked example: Tables 7.2 and 7.3.
func thesisExample() (CostService, CostSource, CostEdge) {
	svc := CostService{DirtyRate: 10, Memory: 1e8, Cores: 0.1, StateBytes: 1e7, Compression: 0.7}
	src := CostSource{PageSize: 4096, Load: 0.2, Speed: 1.13e11}
	e := CostEdge{Name: "e1", Load: 0.2, Cores: 12, FreeMemory: 1.3e10, Bandwidth: 3.2e8, Speed: 1.13e11,
		CPUCost: 40, CPUOffset: 0.1, MemCost: 4.3e-9, StorageCost: 9.39e-11, NetCost: 2.16e-12}
	return svc, src, e
}

func TestCostThesisExample(t *testing.T) {
	svc, src, e := thesisExample()
	c := MigrationCost(svc, src, e)
	if got := fmt.Sprintf("%.2f", c.Euro); got != "1.64" {
		t.Errorf("cost %v €, the thesis says 1.64 €", c.Euro)
	}
	// By hand: CPU 40·1·0.1·(0.2+0.1) = 1.2; memory 4.3e-9·1e8 = 0.43.
	approx(t, "CPU €", c.CPUEuro, 1.2)
	approx(t, "memory €", c.MemEuro, 0.43)
	// 7.7: 1e8/(0.7·0.8·1.13e11) + 1e8·0.7/3.2e8.
	pre := 1e8/(0.7*0.8*1.13e11) + 0.21875
	approx(t, "T_preSync", c.PreSyncS, pre)
	approx(t, "D_m", c.DirtyBytes, pre*10*4096)
	approx(t, "data €", c.DataEuro, (9.39e-11+0.7*2.16e-12)*(1e8+pre*10*4096+1e7))
	rest := 1e7 + pre*10*4096
	approx(t, "T_dump", c.DumpS, rest/(0.8*1.13e11))
	approx(t, "T_dumpSync", c.DumpSyncS, rest/(0.7*0.8*1.13e11)+rest*0.7/3.2e8)
	approx(t, "T_restore", c.RestoreS, (rest+1e8)/(0.8*1.13e11*0.7))
	if math.Abs(c.DowntimeS-0.024) > 0.001 || !c.Feasible() {
		t.Errorf("downtime %v s (want ≈ 0.024), violations %v", c.DowntimeS, c.Violations)
	}
	// The text's "CPU load 0.3" instead of the table's 0.2 would give 2.04 €.
	e.Load = 0.3
	if got := fmt.Sprintf("%.2f", MigrationCost(svc, src, e).Euro); got != "2.04" {
		t.Errorf("with load 0.3: %s €, want 2.04", got)
	}
}

func TestCostConstraints(t *testing.T) {
	svc, src, e := thesisExample()
	svc.MaxDowntime = 0.001 // 7.2
	svc.Cores = 20          // 7.3: 0.2·12 + 20 > 12
	svc.Memory = 2e10       // 7.4
	svc.DirtyRate = 1e9     // 7.6
	c := MigrationCost(svc, src, e)
	got := strings.Join(c.Violations, "\n")
	for _, eq := range []string{"7.2", "7.3", "7.4", "7.6"} {
		if !strings.Contains(got, eq+":") {
			t.Errorf("constraint %s not reported; got:\n%s", eq, got)
		}
	}
	src.Load = 1 // no free CPU at the source: infinite phase times
	if c := MigrationCost(thesisServiceOnly(), src, e); !strings.Contains(strings.Join(c.Violations, " "), "7.14") {
		t.Errorf("a source at full load must violate 7.14: %v", c.Violations)
	}
}

func thesisServiceOnly() CostService { s, _, _ := thesisExample(); return s }

func TestChooseEdge(t *testing.T) {
	svc, src, e := thesisExample()
	cheap, dear, small := e, e, e
	cheap.Name, dear.Name, small.Name = "cheap", "dear", "small"
	dear.MemCost *= 2
	small.MemCost /= 2
	small.FreeMemory = 1e7 // cheapest, but cannot hold the container
	best, all := ChooseEdge(svc, src, []CostEdge{dear, small, cheap})
	if best != 2 || len(all) != 3 || all[1].Feasible() {
		t.Errorf("best %d, estimates %+v; want the cheap edge", best, all)
	}
	if best, _ := ChooseEdge(svc, src, []CostEdge{small}); best != -1 {
		t.Errorf("best %d with no feasible edge, want -1", best)
	}
}
