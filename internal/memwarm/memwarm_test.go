package memwarm

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// resident is this process's resident set, in bytes (/proc/self/statm).
func resident(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

func TestWarmTouchesThenReleases(t *testing.T) {
	const size = 64 << 20
	before := resident(t)
	release := Warm(size)
	warm := resident(t)
	release()
	after := resident(t)
	if warm-before < size*9/10 {
		t.Errorf("warming %d MiB raised the resident set by %d MiB", size>>20, (warm-before)>>20)
	}
	if warm-after < size*9/10 {
		t.Errorf("release gave back %d MiB of %d", (warm-after)>>20, size>>20)
	}
}

func TestWarmNothing(t *testing.T) {
	for _, size := range []int64{0, -1} {
		Warm(size)() // a no-op release, and no panic
	}
}
