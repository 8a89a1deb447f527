package units

import "testing"

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
