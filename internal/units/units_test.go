package units

import (
	"testing"
	"time"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"64M": 64 << 20, "256MiB": 256 << 20, "1G": 1 << 30, "1.5G": 3 << 29, "4096": 4096, "10KB": 10240, " 2g ": 2 << 30} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1M", "abc", "12X", "99999999999T", "NaN"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}

func TestBytesFlag(t *testing.T) {
	var n int64 = 4 << 20
	b := BytesVar(&n)
	if b.String() != "4M" || b.Type() != "size" {
		t.Errorf("default shows as %q (%s)", b.String(), b.Type())
	}
	for in, want := range map[string]int64{"4M": 4 << 20, "1GiB": 1 << 30, "4096": 4096, "1.5K": 1536} {
		if err := b.Set(in); err != nil || n != want {
			t.Errorf("Set(%q): %d %v, want %d", in, n, err, want)
		}
	}
	if err := b.Set("four"); err == nil {
		t.Error("Set(four) accepted")
	}
	n = 1000
	if b.String() != "1000" {
		t.Errorf("1000 shows as %q", b.String())
	}
}

func TestMillis(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want float64
	}{{0, 0}, {1500 * time.Microsecond, 1.5}, {2 * time.Second, 2000}, {999, 0}, {-3 * time.Millisecond, -3}} {
		if got := Millis(c.d); got != c.want {
			t.Errorf("Millis(%v) = %v, want %v", c.d, got, c.want)
		}
	}
}
