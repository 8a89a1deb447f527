package units

import (
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	good := map[string]int64{
		"1gbit":     1_000_000_000,
		"1Gbit":     1_000_000_000,
		"100mbit":   100_000_000,
		"500M":      500_000_000,
		"500m":      500_000_000,
		"2.5g":      2_500_000_000,
		"10kbit":    10_000,
		"64k":       64_000,
		"1000000":   1_000_000,
		"8bit":      8,
		"1mibit":    1 << 20,
		"2Gi":       2 << 30,
		" 200mbit ": 200_000_000,
		"1 gbit":    1_000_000_000,
		"0":         0,
		"1tbit":     1_000_000_000_000,
	}
	for in, want := range good {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "gbit", "fast", "1gb", "100mbps", "1e9", "-5mbit", "1.2.3g", "nan", "inf", "1x", "99999999999999tbit"} {
		if got, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) = %d, want an error", in, got)
		}
	}
	if _, err := ParseRate("100mbps"); err == nil || !strings.Contains(err.Error(), "100mbit") {
		t.Errorf("bps error should suggest mbit: %v", err)
	}
}

func TestFormatRate(t *testing.T) {
	for bps, want := range map[int64]string{
		1_000_000_000: "1gbit", 100_000_000: "100mbit", 2_500_000_000: "2.5gbit", 64_000: "64kbit", 500: "500bit",
	} {
		if got := FormatRate(bps); got != want {
			t.Errorf("FormatRate(%d) = %q, want %q", bps, got, want)
		}
		if back, err := ParseRate(FormatRate(bps)); err != nil || back != bps {
			t.Errorf("round trip of %d: %d, %v", bps, back, err)
		}
	}
}
