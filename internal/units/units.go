// Package units reads the sizes users type (64M, 256MiB, 1G, 4096) and
// states durations the way ferry's results do, in milliseconds.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseBytes reads a size in bytes; K, M, G and T (with or without "iB" or
// "B") are powers of 1024, as memory sizes are.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	upper := strings.ToUpper(t)
	mult := int64(1)
	for _, suf := range []struct {
		s string
		m int64
	}{{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
		{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(upper, suf.s) {
			upper, mult = strings.TrimSuffix(upper, suf.s), suf.m
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(upper), 64)
	if err != nil || v < 0 || math.IsNaN(v) {
		return 0, fmt.Errorf("bad size %q (examples: 64M, 1GiB, 4096)", s)
	}
	if v*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v * float64(mult)), nil
}

// Bytes is a size flag (pflag.Value): it takes what ParseBytes reads and
// prints itself back in the largest unit that divides it.
type Bytes int64

func (b *Bytes) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = Bytes(v)
	return nil
}

func (b Bytes) String() string {
	v := int64(b)
	for _, u := range []struct {
		s string
		m int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if v != 0 && v%u.m == 0 {
			return strconv.FormatInt(v/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(v, 10)
}

// Type names the flag's value in --help.
func (Bytes) Type() string { return "size" }

// BytesVar is a size flag bound to an int64: flags.Var(units.BytesVar(&n), ...).
func BytesVar(p *int64) *Bytes { return (*Bytes)(p) }

// Millis is d in milliseconds, to the microsecond: how reports and results
// state durations.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
