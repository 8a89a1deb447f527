package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

func TestValidateMode(t *testing.T) {
	for _, m := range []string{ModeCold, ModePrecopy, ModePostcopy} {
		if err := validateMode(m); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	if err := validateMode("teleport"); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Errorf("unknown mode: %v", err)
	}
}

func TestFailAtKeepsTheFirstPlace(t *testing.T) {
	err := failAt("outer", failAt("dump on h1", errors.New("criu failed")))
	var f *failure
	if !errors.As(err, &f) || f.where != "dump on h1" {
		t.Fatalf("got %v", err)
	}
	if failAt("x", nil) != nil {
		t.Fatal("failAt(nil) is not nil")
	}
}

func TestStopRule(t *testing.T) {
	o := withDefaults(PrecopyOptions{MaxRounds: 5})
	// The switchover's prediction: what is left over the link, plus 300 ms.
	var asked []float64
	predict := func(left, throughput float64) time.Duration {
		asked = append(asked, left, throughput)
		return seconds(left/throughput + 0.3)
	}
	r0 := Round{Index: 0, Bytes: 256 << 20, DurationMs: 2300}
	if k, _ := stopRule(o, r0, nil, 0, predict); k != keepGoing {
		t.Errorf("first round stopped: %v", k)
	}
	small := Round{Index: 1, Bytes: 1 << 20, DurationMs: 20}
	if k, why := stopRule(o, small, &r0, 1, predict); k != stopSmall || !strings.Contains(why, "threshold") {
		t.Errorf("small round: %v %q", k, why)
	}
	r1 := Round{Index: 1, Bytes: 100 << 20, DurationMs: 900}
	r2 := Round{Index: 2, Bytes: 99 << 20, DurationMs: 890}
	if k, _ := stopRule(o, r2, &r1, 2, predict); k != stopNotConverging {
		t.Errorf("flat rounds: %v", k)
	}
	if k, _ := stopRule(o, r2, &r1, 4, predict); k != stopMaxRounds {
		t.Errorf("last allowed round: %v", k)
	}
	fit := o
	fit.MaxDowntime = 10 * time.Second
	shrinking := Round{Index: 1, Bytes: 50 << 20, DurationMs: 450, DirtyRate: 100}
	if k, why := stopRule(fit, shrinking, &r0, 1, predict); k != stopFits || !strings.Contains(why, "fits") {
		t.Errorf("generous budget: %v %q", k, why)
	}
	// Left: 100 pages/s for 0.45 s; throughput: the better of the two rounds.
	if len(asked) != 2 || asked[0] != 100*0.45*4096 || asked[1] != float64(256<<20)/2.3 {
		t.Errorf("prediction asked for %v", asked)
	}
	fit.MaxDowntime = 250 * time.Millisecond
	if k, _ := stopRule(fit, shrinking, &r0, 1, predict); k != keepGoing {
		t.Errorf("budget below the prediction stopped: %v", k)
	}
}

func TestChannelsForMode(t *testing.T) {
	has := func(mode, kind string) bool {
		for _, k := range channelsFor(mode, PrecopyOptions{MaxRounds: 8}) {
			if k == kind {
				return true
			}
		}
		return false
	}
	if !has(ModePostcopy, ChanLazy) || has(ModePostcopy, ChanPages) {
		t.Error("post-copy must use the lazy channel, not a page stream")
	}
	if !has(ModePrecopy, ChanRounds) || !has(ModePrecopy, ChanPages) {
		t.Error("pre-copy needs rounds and the final page stream")
	}
	if rebuild := ModePrecopy + "/" + SwitchoverRebuild; !has(rebuild, ChanRounds) || !has(rebuild, ChanLazy) || has(rebuild, ChanPages) {
		t.Error("pre-copy's rebuild switchover has rounds and the lazy dump's page server, no page stream")
	}
	if !has(ModeCold, ChanPages) || has(ModeCold, ChanRounds) {
		t.Error("cold has one page stream and no rounds")
	}
}

func TestTechniquesRefuseWhatTheRuntimeCannotDo(t *testing.T) {
	all := runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true, PreDump: true}
	if got := Modes(all); len(got) != len(techniques) {
		t.Errorf("a runtime that can do everything runs %v, want all %d techniques", got, len(techniques))
	}
	// A runtime with no freeze of its own: cold and pre-copy's dump
	// switchover only.
	if got := strings.Join(Modes(runtime.Caps{}), ","); got != "cold,precopy" {
		t.Errorf("no caps: %s", got)
	}
	for _, key := range []string{ModePostcopy, ModeHybrid, keyPrecopyRebuild} {
		err := techniques[key].allows(key, "podman", runtime.Caps{})
		if err == nil || !strings.Contains(err.Error(), "podman") || !strings.Contains(err.Error(), "lazy") {
			t.Errorf("%s without lazy pages: %v", key, err)
		}
	}
	if err := techniques[keyPrecopyNative].allows(keyPrecopyNative, "runc", runtime.Caps{Freeze: true}); err == nil || !strings.Contains(err.Error(), "soft-dirty") {
		t.Errorf("native pre-copy without pre-dump: %v", err)
	}
	// Keys follow the mode and pre-copy's options.
	for _, c := range []struct {
		mode string
		o    PrecopyOptions
		want string
	}{
		{ModeCold, PrecopyOptions{}, ModeCold},
		{ModeCold, PrecopyOptions{Engine: PrecopyContent, Switchover: SwitchoverDump}, ModeCold},
		{ModeCold, PrecopyOptions{Switchover: SwitchoverRebuild}, keyColdRebuild},
		{ModePrecopy, PrecopyOptions{Engine: PrecopyContent, Switchover: SwitchoverDump}, ModePrecopy},
		{ModePrecopy, PrecopyOptions{Engine: PrecopyContent, Switchover: SwitchoverRebuild}, keyPrecopyRebuild},
		{ModePrecopy, PrecopyOptions{Engine: PrecopyNative}, keyPrecopyNative},
		{ModeHybrid, PrecopyOptions{Switchover: SwitchoverRebuild}, ModeHybrid},
	} {
		if got := techniqueKey(c.mode, c.o); got != c.want {
			t.Errorf("techniqueKey(%s, %+v) = %s, want %s", c.mode, c.o, got, c.want)
		}
	}
	// Podman: a lazy dump at the source but no lazy restore: the rebuild
	// switchover (a plain restore) but no post-copy or hybrid.
	podman := runtime.Caps{Freeze: true, LazyDump: true}
	if got := strings.Join(Modes(podman), ","); got != "cold,cold/rebuild,precopy,precopy/rebuild" {
		t.Errorf("lazy dump without lazy restore: %s", got)
	}
	if err := techniques[ModePostcopy].allows(ModePostcopy, "podman", podman); err == nil || !strings.Contains(err.Error(), "lazy restore") {
		t.Errorf("post-copy without a lazy restore: %v", err)
	}
	// auto resolves against the runtime.
	if e := precopyEngine(PrecopyAuto, runtime.Caps{PreDump: true}); e != PrecopyNative {
		t.Errorf("auto with pre-dump: %s", e)
	}
	if sw := precopySwitchover(PrecopyOptions{Engine: PrecopyContent}, runtime.Caps{LazyDump: true}); sw != SwitchoverDump {
		t.Errorf("a runtime that cannot freeze without dumping got switchover %s", sw)
	}
	// Cold rebuilds by itself only where the restore would copy the
	// memory and need not (Docker with ferry-runc).
	docker := runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true, CopiesImages: true}
	runcCaps := runtime.Caps{Freeze: true, LazyDump: true, LazyRestore: true}
	for _, c := range []struct {
		name  string
		asked string
		caps  runtime.Caps
		want  string
	}{
		{"docker", PrecopyAuto, docker, SwitchoverRebuild},
		{"docker, nothing asked", "", docker, SwitchoverRebuild},
		{"docker without a lazy restore", PrecopyAuto, runtime.Caps{Freeze: true, LazyDump: true, CopiesImages: true}, SwitchoverDump},
		{"docker, dump asked", SwitchoverDump, docker, SwitchoverDump},
		{"runc", PrecopyAuto, runcCaps, SwitchoverDump},
		{"runc, rebuild asked", SwitchoverRebuild, runcCaps, SwitchoverRebuild},
	} {
		if got := ColdSwitchover(c.asked, c.caps); got != c.want {
			t.Errorf("cold's switchover, %s: %s, want %s", c.name, got, c.want)
		}
	}
}

// The destination puts back the CPU limit the container was configured
// with, not auto-converge's throttle, and no limit where none was set.
func TestConfiguredCPU(t *testing.T) {
	for _, c := range []struct {
		name string
		spec string
		want cgroups.Bandwidth
	}{
		{"no configuration", ``, cgroups.Unlimited},
		{"no limits", `{"linux":{}}`, cgroups.Unlimited},
		{"shares only", `{"linux":{"resources":{"cpu":{"shares":512}}}}`, cgroups.Unlimited},
		{"podman --cpus 0.5", `{"linux":{"resources":{"cpu":{"quota":50000,"period":100000}}}}`, cgroups.Bandwidth{QuotaUs: 50000, PeriodUs: 100000}},
		{"quota without period", `{"linux":{"resources":{"cpu":{"quota":20000}}}}`, cgroups.Bandwidth{QuotaUs: 20000}},
		{"quota -1", `{"linux":{"resources":{"cpu":{"quota":-1,"period":100000}}}}`, cgroups.Unlimited},
	} {
		if got := configuredCPU([]byte(c.spec)); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
