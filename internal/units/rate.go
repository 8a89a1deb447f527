package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// rateUnits maps a rate suffix to bits per second. Like tc, k/m/g are
// decimal and the "i" forms binary; a bare number is bits per second.
var rateUnits = map[string]float64{
	"": 1, "bit": 1,
	"k": 1e3, "kbit": 1e3, "m": 1e6, "mbit": 1e6, "g": 1e9, "gbit": 1e9, "t": 1e12, "tbit": 1e12,
	"ki": 1 << 10, "kibit": 1 << 10, "mi": 1 << 20, "mibit": 1 << 20, "gi": 1 << 30, "gibit": 1 << 30,
}

// ParseRate parses a link rate such as "1gbit", "100mbit", "500M" or
// "2.5g" into bits per second. "0" means unshaped.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("rate %q: want a number and a unit, e.g. 1gbit, 100mbit, 500M", s)
	}
	if strings.HasSuffix(unit, "bps") {
		// tc reads "bps" as bytes per second, most people as bits: refuse
		// rather than be off by eight.
		return 0, fmt.Errorf("rate %q: %q is ambiguous (bits or bytes?); write %s%sbit for bits per second", s, unit, num, strings.TrimSuffix(unit, "bps"))
	}
	mult, ok := rateUnits[unit]
	if !ok {
		return 0, fmt.Errorf("rate %q: unknown unit %q (use bit, kbit, mbit, gbit, or k, M, G)", s, unit)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("rate %q: %w", s, err)
	}
	bps := math.Round(v * mult)
	if bps > math.MaxInt64/2 {
		return 0, fmt.Errorf("rate %q is too large", s)
	}
	return int64(bps), nil
}

// FormatRate writes bits per second the way ParseRate reads them.
func FormatRate(bps int64) string {
	f := float64(bps)
	for _, u := range []struct {
		name string
		mult float64
	}{{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if f >= u.mult {
			return strconv.FormatFloat(f/u.mult, 'f', -1, 64) + u.name
		}
	}
	return strconv.FormatInt(bps, 10) + "bit"
}
