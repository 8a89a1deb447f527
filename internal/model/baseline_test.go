package model

import (
	"math"
	"testing"
)

func TestIdealHandComputed(t *testing.T) {
	// q = Rσ/L = 1000·4096/1e8 = 0.04096.
	r := Ideal(1e9, 1000, 4096, 1e8, 1, 0.5)
	want := []float64{1e9, 4.096e7, 1e9 * 0.04096 * 0.04096}
	for i, v := range want {
		approx(t, "V_i", r.Volumes[i], v)
		approx(t, "T_i", r.Durations[i], v/1e8)
	}
	approx(t, "downtime", r.Downtime, want[2]/1e8+0.5)
	approx(t, "total", r.Total, 10+0.4096+r.Downtime)
	if !r.Converges {
		t.Error("Rσ < L must converge")
	}
	if d := Ideal(1e9, 1e5, 4096, 1e8, 2, 0); d.Converges || d.Volumes[2] <= d.Volumes[1] {
		t.Errorf("Rσ > L: volumes must grow, got %v", d.Volumes)
	}
}

// The ideal model's downtime keeps falling with iterations; PAM's does not,
// since every dump costs processing time (the paper's Fig 8 argument).
func TestIdealVersusPAMIterations(t *testing.T) {
	p := handPAM()
	var prevIdeal, prevPAM float64 = math.Inf(1), 0
	for I := 0; I < 6; I++ {
		id := Ideal(1e9, 1000, 4096, 1e8, I, p.Restore(1e9))
		if id.Downtime >= prevIdeal {
			t.Errorf("ideal downtime did not fall at I=%d", I)
		}
		prevIdeal = id.Downtime
		pam := PAM(p, PAMInputs{M: 1e9, R: 1000, L: []float64{1e8}, I: I})
		if pam.Downtime < p.CkpDump(1e9, p.RHat(1000))+p.Restore(1e9) {
			t.Errorf("PAM downtime %v below its processing floor", pam.Downtime)
		}
		if I > 0 && pam.Total <= prevPAM {
			t.Errorf("PAM total did not grow with I=%d", I)
		}
		prevPAM = pam.Total
	}
}

func TestTextbookTimelines(t *testing.T) {
	// Rows of the thesis' Table 8.2 (T_down = T_ckp + T_sync + T_res).
	for _, row := range [][4]float64{
		{0.5, 0.1, 1.3, 1.9}, {1.1, 0.09, 1.1, 2.29}, {3.6, 1, 1.5, 6.1}, {6.5, 10, 8, 24.5},
	} {
		mig, down := ColdTimeline(row[0], row[1], row[2])
		approx(t, "cold migrate", mig, row[3])
		approx(t, "cold down", down, row[3])
	}
	mig, down := PrecopyTimeline(1, 5, 2, 0.3, 0.2)
	approx(t, "pre-copy migrate", mig, 8)
	approx(t, "pre-copy down", down, 0.5)
	mig, down = PostcopyTimeline(0.2, 0.1, 3)
	approx(t, "post-copy migrate", mig, 3.3)
	approx(t, "post-copy down", down, 0.1)
}
