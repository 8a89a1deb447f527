package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseSize reads a byte count such as "4096", "64M", "64MiB", "1G" or
// "1GiB". Every unit is binary: K, KB and KiB all mean 2^10.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	num, unit := t[:i], strings.ToLower(t[i:])
	var shift uint
	switch strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i") {
	case "":
		if unit == "ib" { // "ib" alone is no unit
			return 0, fmt.Errorf("size %q: unknown unit %q", s, t[i:])
		}
	case "k":
		shift = 10
	case "m":
		shift = 20
	case "g":
		shift = 30
	case "t":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q", s, t[i:])
	}
	// "Mi" without the b is not accepted; "MiB" and "MB" are.
	if strings.HasSuffix(unit, "i") {
		return 0, fmt.Errorf("size %q: unknown unit %q", s, t[i:])
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if n > math.MaxUint64>>shift {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n << shift, nil
}
