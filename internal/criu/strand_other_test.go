//go:build linux && !amd64

package criu

import "io"

// The parts orphans_test.go's helpers play (a stranded restore, compel)
// inject amd64 code: elsewhere the test binary has none to play.
const (
	strandEnv = "FERRY_TEST_STRAND"
	compelEnv = "FERRY_TEST_COMPEL"
)

func playStrand(string, io.Reader, io.Writer) {}

func playCompel(int, io.Reader, io.Writer) {}
