package lab

import (
	"maps"
	"slices"
	"testing"
	"time"
)

func TestParseRTTs(t *testing.T) {
	ms := time.Millisecond
	good := map[string]map[string]time.Duration{
		"20ms":                {"*": 20 * ms},
		"h1=20ms,h2=50ms":     {"h1": 20 * ms, "h2": 50 * ms},
		"1=5ms, ferry-h3=0":   {"h1": 5 * ms, "h3": 0},
		"10ms,h2=1ms":         {"*": 10 * ms, "h2": ms},
		"h1=1.5ms,":           {"h1": 1500 * time.Microsecond},
		"h1=20ms,h1=30ms":     {"h1": 30 * ms},
		"0":                   {"*": 0},
		"h16=200ms,h2=0.25ms": {"h16": 200 * ms, "h2": 250 * time.Microsecond},
	}
	for in, want := range good {
		got, err := ParseRTTs(in)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("ParseRTTs(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", ",", "20", "fast", "h0=1ms", "x1=1ms", "h1=", "h1=soon"} {
		if got, err := ParseRTTs(in); err == nil {
			t.Errorf("ParseRTTs(%q) = %v, want an error", in, got)
		}
	}
}

func TestExpandRTTs(t *testing.T) {
	ms := time.Millisecond
	got := ExpandRTTs(map[string]time.Duration{"*": 10 * ms, "h2": ms}, 3)
	want := map[string]time.Duration{"h1": 10 * ms, "h2": ms, "h3": 10 * ms}
	if !maps.Equal(got, want) {
		t.Errorf("ExpandRTTs = %v, want %v", got, want)
	}
	if got := ExpandRTTs(map[string]time.Duration{"h2": ms}, 3); !maps.Equal(got, map[string]time.Duration{"h2": ms}) {
		t.Errorf("ExpandRTTs without * = %v", got)
	}
}

func TestCheckRTTs(t *testing.T) {
	if err := checkRTTs(map[string]time.Duration{"h1": time.Second, "h3": 0}, 3); err != nil {
		t.Error(err)
	}
	for _, bad := range []map[string]time.Duration{{"h4": 0}, {"h1": -time.Millisecond}, {"h1": time.Minute}, {"hx": 0}} {
		if err := checkRTTs(bad, 3); err == nil {
			t.Errorf("checkRTTs(%v) passed", bad)
		}
	}
}

func TestDelayLineArgs(t *testing.T) {
	h := newHost(2)
	h.RTT = 20 * time.Millisecond
	got := delayLineArgs(&h, 2)
	want := []string{"lab-tool", "delay-line", "--control", RunDir + "/h2-delay.sock", "--rtt", "20ms",
		"--pair", "h2svc:h2svcr", "--pair", "h2:h2r", "--pair", "h2p1:h2p1r"}
	if !slices.Equal(got, want) {
		t.Errorf("delayLineArgs = %q\nwant %q", got, want)
	}
	// Interface names must fit IFNAMSIZ (15 bytes) for every host and path.
	last := newHost(MaxHosts)
	ports := []string{segmentPort(&last)}
	for p := range MaxPaths {
		ports = append(ports, switchPort(&last, p))
	}
	for _, port := range ports {
		for _, name := range []string{relayPort(port), bridgedPort(port)} {
			if len(name) > 15 {
				t.Errorf("interface name %q too long", name)
			}
		}
	}
}
