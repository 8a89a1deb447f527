package report

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/html"
	gplot "gonum.org/v1/plot"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/experiment"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/plot"
)

// svgTexts are a figure's SVG texts with their vertical place on screen
// (gonum flips y: the larger, the lower).
type svgText struct {
	text string
	y    float64
}

func svgTexts(t *testing.T, fig *html.Node) []svgText {
	t.Helper()
	var out []svgText
	for _, n := range all(fig, tag("text")) {
		y, err := strconv.ParseFloat(attr(n, "y"), 64)
		if err != nil {
			t.Fatalf("text %q at y %q", textOf(n), attr(n, "y"))
		}
		out = append(out, svgText{textOf(n), y})
	}
	return out
}

func findText(ts []svgText, s string) (svgText, bool) {
	i := slices.IndexFunc(ts, func(t svgText) bool { return t.text == s })
	if i < 0 {
		return svgText{}, false
	}
	return ts[i], true
}

// The Gantt chart lists modes from the top in ferry's order.
func TestTimelineRowsTopDown(t *testing.T) {
	_, doc := write(t, synthetic())
	ts := svgTexts(t, byID(doc, "w-memhog-timeline"))
	var ys []float64
	for _, mode := range fixtureModes {
		tx, ok := findText(ts, mode)
		if !ok {
			t.Fatalf("no row %s", mode)
		}
		ys = append(ys, tx.y)
	}
	if !slices.IsSorted(ys) {
		t.Errorf("rows %v at y %v: not top to bottom", fixtureModes, ys)
	}
}

// The downtime caption names the method its error bars use.
func TestDowntimeCaptionMethods(t *testing.T) {
	repeats := func(n int) experiment.Results {
		res := synthetic()
		var runs []experiment.Run
		seen := map[experiment.Point]int{}
		for _, r := range res.Runs {
			if r.Workload == "memhog" && r.OK && seen[r.Point] < n {
				seen[r.Point]++
				runs = append(runs, r)
			}
		}
		res.Runs = runs
		return res
	}
	onlyCI := repeats(6)
	onlyCI.Runs = slices.DeleteFunc(onlyCI.Runs, func(r experiment.Run) bool { return r.StateBytes != 256<<20 })
	for _, c := range []struct {
		name string
		res  experiment.Results
		want string
	}{
		{"six runs everywhere", onlyCI, "Error bars: the 95 % confidence interval of the median, from order statistics"},
		{"three runs everywhere", repeats(3), "Every point has fewer than 6 completed runs"},
		{"mixed", repeats(6), "at the 8 points with fewer, too few for one, they span the minimum to the maximum"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, doc := write(t, c.res)
			f := byID(doc, "w-memhog-downtime")
			if f == nil {
				t.Fatal("no downtime figure")
			}
			if got := textOf(all(f, tag("figcaption"))[0]); !strings.Contains(got, c.want) {
				t.Errorf("caption %q lacks %q", got, c.want)
			}
		})
	}
}

func TestRoundsFinalMarked(t *testing.T) {
	_, doc := write(t, synthetic())
	for _, w := range []string{"memhog", "redis"} {
		ts := svgTexts(t, byID(doc, "w-"+w+"-rounds"))
		finals := 0
		for _, tx := range ts {
			if tx.text == "final" {
				finals++
			}
		}
		if finals != 1 { // hybrid's one run shown
			t.Errorf("%s: %d rounds labelled final, want 1", w, finals)
		}
		for _, i := range []string{"0", "1", "2", "3"} {
			if _, ok := findText(ts, i); !ok {
				t.Errorf("%s: no round %s on the axis", w, i)
			}
		}
	}
}

// A client that never failed a request has no errors line.
func TestClientWithoutErrors(t *testing.T) {
	res := synthetic()
	for i, r := range res.Runs {
		if r.Client == nil {
			continue
		}
		c := *r.Client
		c.Timeline = slices.Clone(c.Timeline)
		for j := range c.Timeline {
			c.Timeline[j].Errors = 0
		}
		res.Runs[i].Client = &c
	}
	_, doc := write(t, res)
	got := textOf(byID(doc, "w-redis-client"))
	if strings.Contains(got, "errors/s") {
		t.Error("an errors line without errors")
	}
	if !strings.Contains(got, "answered/s") {
		t.Error("no throughput")
	}
}

// One colour per mode across the report: the same fill for hybrid in the
// rounds figures of both workloads, and none shared by two modes.
func TestModeColors(t *testing.T) {
	runs := []experiment.Run{
		{Point: experiment.Point{Mode: "hybrid"}}, {Point: experiment.Point{Mode: "teleport"}},
		{Point: experiment.Point{Mode: "cold"}}, {Point: experiment.Point{Mode: "hybrid"}},
	}
	colors := modeColors(runs)
	if len(colors) != 3 || colors["cold"] != plot.Color(0) || colors["hybrid"] != plot.Color(1) || colors["teleport"] != plot.Color(2) {
		t.Errorf("colours %v: want cold, hybrid, then unknown modes", colors)
	}
	page, _ := write(t, synthetic())
	hybrid := colors["hybrid"].(color.RGBA)
	fill := "fill:#" + strings.ToUpper(strconv.FormatUint(uint64(hybrid.R)<<16|uint64(hybrid.G)<<8|uint64(hybrid.B)|1<<24, 16)[1:])
	for _, id := range []string{`id="w-memhog-rounds"`, `id="w-redis-rounds"`} {
		at := strings.Index(string(page), id)
		end := at + strings.Index(string(page[at:]), "</figure>")
		if at < 0 || !strings.Contains(string(page[at:end]), fill) {
			t.Errorf("%s does not draw hybrid in %s", id, fill)
		}
	}
}

func TestPageStructure(t *testing.T) {
	_, doc := write(t, synthetic())
	// Ids are unique; the navigation links to each workload.
	seen := map[string]bool{}
	for _, n := range all(doc, func(n *html.Node) bool { return attr(n, "id") != "" }) {
		id := attr(n, "id")
		if seen[id] {
			t.Errorf("id %s twice", id)
		}
		seen[id] = true
	}
	var links []string
	for _, a := range all(doc, tag("a")) {
		links = append(links, attr(a, "href"))
	}
	if !slices.Equal(links, []string{"#w-memhog", "#w-redis"}) {
		t.Errorf("navigation %q", links)
	}
	// One workload: no navigation.
	res := synthetic()
	res.Runs = slices.DeleteFunc(res.Runs, func(r experiment.Run) bool { return r.Workload != "redis" })
	if _, doc := write(t, res); len(all(doc, tag("nav"))) != 0 {
		t.Error("navigation for a single workload")
	}
	// The method is explained.
	method := textOf(byID(doc, "method"))
	for _, want := range []string{"Binomial(n, ½)", "[x(k), x(n+1−k)]", "fewer than 6 completed runs", "minimum to the maximum", "median total time"} {
		if !strings.Contains(method, want) {
			t.Errorf("the method lacks %q", want)
		}
	}
}

// Two workloads whose names slug alike keep distinct ids.
func TestWorkloadIDs(t *testing.T) {
	r := synthetic().Runs[0]
	a, b := r, r
	a.Workload, b.Workload = "my app", "my-app"
	_, doc := write(t, experiment.Results{Runs: []experiment.Run{a, b}})
	if byID(doc, "w-my-app") == nil || byID(doc, "w-my-app-2") == nil || byID(doc, "w-my-app-2-timeline") == nil {
		t.Error("ids of workloads alike clash")
	}
	seen := map[string]int{}
	if uniqueID(seen, "x") != "x" || uniqueID(seen, "x") != "x-2" || uniqueID(seen, "x") != "x-3" {
		t.Error("uniqueID")
	}
}

func TestCells(t *testing.T) {
	ci := newCell(MedianCI([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9}), formatMs)
	if ci.Median != "5.00" || ci.Range != "2.00–8.00" || ci.MinMax || !strings.Contains(ci.Note, "x(2) to x(8) of 9") || !strings.Contains(ci.Note, "coverage 96.1 %") {
		t.Errorf("%+v", ci)
	}
	mm := newCell(MedianCI([]float64{100, 300}), formatMs)
	if mm.Median != "200" || mm.Range != "100–300" || !mm.MinMax || !strings.Contains(mm.Note, "too few") {
		t.Errorf("%+v", mm)
	}
	if none := newCell(MedianCI(nil), formatMs); none.Median != "–" || none.Range != "" {
		t.Errorf("%+v", none)
	}
}

func TestLabels(t *testing.T) {
	w := &workload{varies: factors{runtime: true, state: true, load: true}}
	p := experiment.Point{Mode: "cold", Runtime: "lxc", StateBytes: 64 << 20, Load: 200, DirtyRate: 5, BandwidthBps: 1e9}
	if got := w.label(p, true); got != "cold, lxc, 64 MiB, 200 req/s" {
		t.Errorf("label %q", got)
	}
	if got := w.label(p, false); got != "cold, lxc, 200 req/s" {
		t.Errorf("label without state %q", got)
	}
	if got := describe(p); got != "lxc, 64 MiB of state, 5 pages/s dirtied, 200 requests/s, link 1 Gbit/s" {
		t.Errorf("describe %q", got)
	}
	if got := pointName(p); got != "cold, lxc, 64 MiB, 5 pages/s, 200 req/s, 1 Gbit/s" {
		t.Errorf("pointName %q", got)
	}
}

func TestPhases(t *testing.T) {
	r := experiment.Run{TotalMs: 500, Phases: []engine.PhaseSpan{
		{Name: "prepare", StartMs: 0, EndMs: 10}, {Name: "freeze", StartMs: 10, EndMs: 12}, {Name: "restore", StartMs: 400},
	}}
	if at, ok := freezeStart(r); !ok || at != 10 {
		t.Errorf("freezeStart %v %v", at, ok)
	}
	if _, ok := freezeStart(experiment.Run{}); ok {
		t.Error("a freeze in a run without phases")
	}
	if got := phaseEnd(r, r.Phases[2]); got != 500 {
		t.Errorf("an open phase ends at %v, want the run's end", got)
	}
	if got := phaseEnd(experiment.Run{}, engine.PhaseSpan{StartMs: 30}); got != 30 {
		t.Errorf("an open phase of a run without a total ends at %v", got)
	}
	for name, want := range map[string]string{"round-0": "rounds", "round-12": "rounds", "round-x": "rounds", "dump": "dump", "rounds": "rounds"} {
		if got := phaseCategory(name); got != want {
			t.Errorf("phaseCategory(%q) = %q", name, got)
		}
	}
	if phaseColor("round-1", 0) == phaseColor("round-2", 0) {
		t.Error("consecutive rounds alike")
	}
	if phaseColor("round-0", 0) != phaseColor("round-2", 0) {
		t.Error("even rounds differ")
	}
	if phaseColor("warp", 0) == phaseColor("warp2", 1) {
		t.Error("unknown phases alike")
	}
	if phaseOrder("prepare") >= phaseOrder("commit") || phaseOrder("warp") != len(phaseColors) {
		t.Error("phaseOrder")
	}
}

func TestClientOffset(t *testing.T) {
	r := experiment.Run{StartUnixMs: 10_500, Client: &labtool.LoadResult{StartUnixMs: 8_000}}
	if off, ok := clientOffset(r); !ok || off != 2500 {
		t.Errorf("offset %v %v", off, ok)
	}
	r.StartUnixMs = 0
	if _, ok := clientOffset(r); ok {
		t.Error("an offset without the migration's clock")
	}
}

func TestSegments(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4, 5}
	ys := []float64{1, 0, 2, 3, 0, 4}
	segs := segments(xs, ys, func(i int) bool { return ys[i] > 0 })
	if len(segs) != 3 || len(segs[0]) != 1 || len(segs[1]) != 2 || segs[1][1].X != 3 || len(segs[2]) != 1 {
		t.Errorf("segments %v", segs)
	}
	if segs := segments(xs, ys, func(int) bool { return false }); segs != nil {
		t.Errorf("segments of nothing %v", segs)
	}
}

func TestMedianLine(t *testing.T) {
	ivs := []Interval{MedianCI([]float64{10, 20, 30}), MedianCI(nil), MedianCI([]float64{0, 1, 2})}
	line, _, bars, err := medianLine([]float64{4, 2, 1}, ivs, color.Black, true)
	if err != nil {
		t.Fatal(err)
	}
	// On a log axis the third, whose minimum is 0, is left out, and so is
	// the empty second.
	if len(line.XYs) != 1 || line.XYs[0] != (struct{ X, Y float64 }{4, 20}) {
		t.Errorf("line %v", line.XYs)
	}
	if low, high := bars.YError(0); low != 10 || high != 10 {
		t.Errorf("error bar -%v +%v, want the min–max of 10..30", low, high)
	}
	line, _, _, err = medianLine([]float64{4, 2, 1}, ivs, color.Black, false)
	if err != nil || len(line.XYs) != 2 || line.XYs[0].X != 1 {
		t.Errorf("linear: %v %v (sorted by x)", line.XYs, err)
	}
	if line, _, _, _ := medianLine([]float64{1}, []Interval{MedianCI(nil)}, color.Black, false); line != nil {
		t.Error("a line without points")
	}
}

func TestBoxesAndSpans(t *testing.T) {
	bs := boxes{{x0: 2, x1: 1, y0: 0, y1: 5}, {x0: 3, x1: 4, y0: -1, y1: 1}}
	if x0, x1, y0, y1 := bs.DataRange(); x0 != 1 || x1 != 4 || y0 != -1 || y1 != 5 {
		t.Errorf("boxes range %v %v %v %v", x0, x1, y0, y1)
	}
	// A span widens x only: y stays as the data has it.
	p := gplot.New()
	p.Add(bs, span{x0: -3, x1: 2})
	if p.X.Min != -3 || p.X.Max != 4 || p.Y.Min != -1 || p.Y.Max != 5 {
		t.Errorf("range x [%v, %v] y [%v, %v]", p.X.Min, p.X.Max, p.Y.Min, p.Y.Max)
	}
	if _, _, y0, y1 := (span{}).DataRange(); !math.IsInf(y0, 1) || !math.IsInf(y1, -1) {
		t.Error("a span has a y range")
	}
}

// A grid whose runtime and link vary: the table gets a runtime column,
// the downtime lines name the link, and modes split into lines get a
// colour each; figures of one run per mode keep to one setting.
func TestVaryingFactors(t *testing.T) {
	var runs []experiment.Run
	for _, r := range synthetic().Runs {
		if r.Workload != "memhog" || r.Mode == "postcopy" || r.Mode == "hybrid" {
			continue
		}
		runs = append(runs, r)
		podman := r
		podman.Runtime, podman.BandwidthBps = "podman", 300_000_000
		podman.TotalMs *= 2
		runs = append(runs, podman)
	}
	_, doc := write(t, experiment.Results{Runs: runs})
	header := textOf(all(doc, func(n *html.Node) bool { return n.Data == "thead" })[0])
	if !strings.HasPrefix(header, "runtimemode") {
		t.Errorf("header %q: no runtime column first", header)
	}
	got := textOf(byID(doc, "w-memhog-downtime"))
	for _, want := range []string{"cold, runc, 1 Gbit/s", "cold, podman, 300 Mbit/s", "precopy, podman, 300 Mbit/s"} {
		if !strings.Contains(got, want) {
			t.Errorf("downtime legend lacks %q", want)
		}
	}
	// Four lines, four colours.
	page, _ := write(t, experiment.Results{Runs: runs})
	at := strings.Index(string(page), `id="w-memhog-downtime"`)
	fig := string(page[at : at+strings.Index(string(page[at:]), "</figure>")])
	for i := range 4 {
		c := plot.Color(i).(color.RGBA)
		stroke := "stroke:#" + strings.ToUpper(strconv.FormatUint(uint64(c.R)<<16|uint64(c.G)<<8|uint64(c.B)|1<<24, 16)[1:])
		if !strings.Contains(fig, stroke) {
			t.Errorf("no line in %s", stroke)
		}
	}
	// The timeline keeps to one runtime: its caption names it.
	caption := textOf(all(byID(doc, "w-memhog-timeline"), tag("figcaption"))[0])
	if strings.Contains(caption, "runc") == strings.Contains(caption, "podman") {
		t.Errorf("the timeline mixes or names no setting: %q", caption)
	}
}

// Many workloads and points: every section is there, figures numbered in
// order across them.
func TestManyWorkloads(t *testing.T) {
	base := synthetic().Runs
	var runs []experiment.Run
	for i := range 5 {
		for _, r := range base {
			r.Workload = fmt.Sprintf("service-%d", i)
			runs = append(runs, r)
		}
	}
	_, doc := write(t, experiment.Results{Runs: runs})
	if n := len(all(doc, func(n *html.Node) bool { return n.Data == "section" && attr(n, "class") == "workload" })); n != 5 {
		t.Fatalf("%d sections, want 5", n)
	}
	var numbers []int
	for _, c := range all(doc, tag("figcaption")) {
		var n int
		if _, err := fmt.Sscanf(textOf(c), "Figure %d.", &n); err != nil {
			t.Fatalf("caption %q", textOf(c))
		}
		numbers = append(numbers, n)
	}
	for i, n := range numbers {
		if n != i+1 {
			t.Fatalf("figure numbers %v", numbers)
		}
	}
	if len(numbers) != 5*5 { // every workload has clients: all five figures
		t.Errorf("%d figures, want 25", len(numbers))
	}
}
