// Package units parses the sizes users type: 64M, 256MiB, 1G, 4096.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
