package main

import "github.com/ferry-migrate/ferry/internal/units"

// parseSize reads a byte count such as "4096", "64M", "64MiB" or "1G": the
// same sizes ferry's own commands take.
func parseSize(s string) (uint64, error) {
	n, err := units.ParseBytes(s)
	return uint64(n), err
}
