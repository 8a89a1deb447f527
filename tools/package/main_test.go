package main

import "testing"

func TestDebVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":           "1.2.3",
		"1.2.3-4-gabc1234": "1.2.3-4-gabc1234",
		"4d6026f":          "0.0.0~git4d6026f",
		"9b084ee-dirty":    "0.0.0~git9b084ee.dirty",
		"dev":              "0.0.0~gitdev",
		"":                 "0.0.0~gitunknown",
		"v2.0.0-rc1-dirty": "2.0.0-rc1-dirty",
		"abc/def":          "0.0.0~gitabc.def",
	} {
		if got := debVersion(in); got != want {
			t.Errorf("debVersion(%q) = %q, want %q", in, got, want)
		}
	}
}
