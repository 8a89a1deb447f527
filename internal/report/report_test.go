package report

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/experiment"
)

// write renders res and parses the page.
func write(t *testing.T, res experiment.Results) ([]byte, *html.Node) {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, res); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatalf("the page does not parse: %v", err)
	}
	return b.Bytes(), doc
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// all lists the elements below n (n included) that match.
func all(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for d := range n.Descendants() {
		if d.Type == html.ElementNode && match(d) {
			out = append(out, d)
		}
	}
	if n.Type == html.ElementNode && match(n) {
		out = append([]*html.Node{n}, out...)
	}
	return out
}

func tag(name string) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.Data == name }
}

func textOf(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}

func byID(doc *html.Node, id string) *html.Node {
	ns := all(doc, func(n *html.Node) bool { return attr(n, "id") == id })
	if len(ns) != 1 {
		return nil
	}
	return ns[0]
}

// page is what the tests look at in a written report.
type pageView struct {
	figures map[string]*html.Node // by id: the <figure>
	omitted map[string]string     // by id: the sentence in its place
	order   []string              // the ids of both, in order
}

func inspect(t *testing.T, doc *html.Node) pageView {
	t.Helper()
	pv := pageView{figures: map[string]*html.Node{}, omitted: map[string]string{}}
	for _, n := range all(doc, func(n *html.Node) bool {
		return n.Data == "figure" || (n.Data == "p" && attr(n, "class") == "omitted" && attr(n, "data-figure") != "")
	}) {
		id := attr(n, "id")
		pv.order = append(pv.order, id)
		if n.Data == "figure" {
			pv.figures[id] = n
			continue
		}
		pv.omitted[id] = textOf(n)
	}
	return pv
}

var allKinds = []string{figTimeline, figDowntime, figRounds, figClient, figPredicted}

func TestEveryFigureWithData(t *testing.T) {
	res := synthetic()
	_, doc := write(t, res)
	pv := inspect(t, doc)

	want := map[string]bool{} // id: drawn
	for _, w := range []string{"memhog", "redis"} {
		for _, k := range allKinds {
			want["w-"+w+"-"+k] = !(w == "memhog" && k == figClient)
		}
	}
	if len(pv.order) != len(want) {
		t.Fatalf("figures and omissions %q, want %d", pv.order, len(want))
	}
	number := 0
	for _, id := range pv.order {
		drawn, ok := want[id]
		if !ok {
			t.Errorf("unexpected figure %s", id)
			continue
		}
		if !drawn {
			if !strings.Contains(pv.omitted[id], "memhog's probe") {
				t.Errorf("%s: omitted for %q", id, pv.omitted[id])
			}
			continue
		}
		f := pv.figures[id]
		if f == nil {
			t.Errorf("%s: missing (omitted: %q)", id, pv.omitted[id])
			continue
		}
		number++
		svgs := all(f, tag("svg"))
		if len(svgs) != 1 {
			t.Errorf("%s: %d <svg>", id, len(svgs))
			continue
		}
		if n := len(all(svgs[0], func(n *html.Node) bool { return n.Data == "path" })); n < 10 {
			t.Errorf("%s: only %d paths drawn", id, n)
		}
		caps := all(f, tag("figcaption"))
		if len(caps) != 1 {
			t.Errorf("%s: %d captions", id, len(caps))
			continue
		}
		caption := textOf(caps[0])
		if !strings.HasPrefix(caption, fmt.Sprintf("Figure %d. ", number)) {
			t.Errorf("%s: caption %q, want figure %d", id, caption, number)
		}
		if !regexp.MustCompile(`\d+ (completed )?runs|of \d+`).MatchString(caption) {
			t.Errorf("%s: the caption does not say how many runs: %q", id, caption)
		}
	}

	// What each figure must show, by its texts.
	svgText := func(id string) string {
		if f := pv.figures[id]; f != nil {
			return textOf(f)
		}
		return ""
	}
	for id, wants := range map[string][]string{
		"w-memhog-timeline":  {"cold", "precopy", "postcopy", "hybrid", "pre-copy rounds", "freeze", "dump", "restore", "lazy-pages", "downtime", "of 3"},
		"w-memhog-downtime":  {"client downtime (longest stall)", "migration downtime (reported)", "state (MiB)", "cold", "hybrid", "confidence interval", "minimum to the maximum"},
		"w-memhog-rounds":    {"precopy", "hybrid", "final", "final round (frozen)", "MiB sent"},
		"w-redis-client":     {"cold: latency", "hybrid: throughput", "p50 latency", "p99 latency", "answered/s", "errors/s", "migration", "downtime", "redis client", "100 ms bucket"},
		"w-memhog-predicted": {"cold total", "cold client downtime", "hybrid total", "y = x", "measured (ms)", "24 markers for 12 grid points"},
	} {
		got := svgText(id)
		for _, w := range wants {
			if !strings.Contains(got, w) {
				t.Errorf("%s lacks %q", id, w)
			}
		}
	}
	// Rounds are only drawn for the modes that did some.
	if got := svgText("w-memhog-rounds"); strings.Contains(got, "cold") || strings.Contains(got, "postcopy") {
		t.Error("the rounds figure shows a mode without rounds")
	}
}

// Every address in the page is a fragment or inline data: nothing to fetch.
func TestNoExternalReferences(t *testing.T) {
	page, doc := write(t, synthetic())
	for _, n := range all(doc, func(*html.Node) bool { return true }) {
		switch n.Data {
		case "script", "link", "iframe", "object", "embed", "img", "base":
			t.Errorf("the page has a <%s>", n.Data)
		}
		for _, a := range n.Attr {
			key := strings.ToLower(a.Key)
			if key == "src" || key == "href" || strings.HasSuffix(key, ":href") || key == "xlink:href" || key == "srcset" || key == "action" {
				if !strings.HasPrefix(a.Val, "#") && !strings.HasPrefix(a.Val, "data:") {
					t.Errorf("<%s %s=%q> points elsewhere", n.Data, a.Key, a.Val)
				}
			}
			if strings.HasPrefix(key, "on") {
				t.Errorf("<%s %s> is script", n.Data, a.Key)
			}
		}
	}
	// CSS, in <style> and in style attributes, fetches only data URLs.
	for _, m := range regexp.MustCompile(`url\(\s*['"]?([^'")]{0,12})`).FindAllSubmatch(page, -1) {
		if !bytes.HasPrefix(m[1], []byte("data:")) {
			t.Errorf("CSS fetches %q", m[1])
		}
	}
	if bytes.Contains(page, []byte("@import")) {
		t.Error("CSS imports a stylesheet")
	}
	// The embedded font is there, once, and the SVG's text asks for it.
	if n := bytes.Count(page, []byte("url(data:font/ttf;base64,")); n != 1 {
		t.Errorf("%d embedded fonts, want 1", n)
	}
	if !bytes.Contains(page, []byte("font-family:'Liberation Sans',")) {
		t.Error("the figures' text does not ask for Liberation Sans")
	}
	// Inline SVG has no XML declaration in HTML.
	if bytes.Contains(page, []byte("<?xml")) {
		t.Error("an XML declaration inside the page")
	}
}

func TestTable(t *testing.T) {
	res := synthetic()
	_, doc := write(t, res)
	tables := all(doc, func(n *html.Node) bool { return n.Data == "table" && attr(n, "class") == "points" })
	if len(tables) != 2 {
		t.Fatalf("%d tables of points, want one per workload", len(tables))
	}
	rows := all(tables[0], func(n *html.Node) bool { return n.Data == "tr" })[1:] // less the header
	if len(rows) != 12 {
		t.Fatalf("memhog: %d rows, want 12 (4 modes × 3 sizes)", len(rows))
	}
	cells := func(r *html.Node) []string {
		var out []string
		for _, td := range all(r, tag("td")) {
			out = append(out, textOf(td))
		}
		return out
	}
	header := cells(rows[0])
	// runtime, mode, state, dirty, link, completed, total, downtime,
	// client, MiB, state OK
	if len(header) != 11 {
		t.Fatalf("row %q: want 11 cells (no load column: memhog has none)", header)
	}
	// The first point: cold 64 MiB, 3 repeats of which one failed, and
	// the failure with no phases: 2 of 4 completed, a min–max range.
	if cells(rows[0])[0] != "runc" {
		t.Errorf("no runtime in the first cell: %q", cells(rows[0]))
	}
	if got := cells(rows[0])[1:]; got[0] != "cold" || got[1] != "64 MiB" || got[2] != "500" || got[3] != "1 Gbit/s" || got[4] != "2/4" || !strings.HasSuffix(got[5], "†") || got[9] != "3/4" {
		t.Errorf("cold 64 MiB: %q", got)
	}
	// cold 256 MiB has six runs, all completed: a real interval.
	var cold256 []string
	for _, r := range rows {
		if c := cells(r)[1:]; c[0] == "cold" && c[1] == "256 MiB" {
			cold256 = c
		}
	}
	if cold256 == nil || cold256[4] != "6/6" || strings.Contains(cold256[5], "†") {
		t.Errorf("cold 256 MiB: %q", cold256)
	}
	// Its numbers, against the runs themselves.
	var totals []float64
	for _, r := range res.Runs {
		if r.Workload == "memhog" && r.Mode == "cold" && r.StateBytes == 256<<20 && r.OK {
			totals = append(totals, r.TotalMs)
		}
	}
	iv := MedianCI(totals)
	if want := formatMs(iv.Median) + formatMs(iv.Lo) + "–" + formatMs(iv.Hi); cold256 != nil && cold256[5] != want {
		t.Errorf("cold 256 MiB total %q, want %q", cold256[5], want)
	}

	failed := all(doc, func(n *html.Node) bool { return n.Data == "table" && attr(n, "class") == "failed" })
	if len(failed) != 1 { // redis had no failure
		t.Fatalf("%d tables of failed runs, want 1", len(failed))
	}
	text := textOf(failed[0])
	for _, want := range []string{"prepare: container not found", "dump: criu exited 1", "cold, runc, 64 MiB, 500 pages/s, 1 Gbit/s"} {
		if !strings.Contains(text, want) {
			t.Errorf("failed runs lack %q", want)
		}
	}
	if s := textOf(byID(doc, "w-redis")); !strings.Contains(s, "Failed runs") || !strings.Contains(s, "None.") {
		t.Error("redis does not say that no run failed")
	}
}

// Results with parts missing: each figure that cannot be drawn is left out
// with its reason, the rest still are, and nothing crashes.
func TestOmittedFigures(t *testing.T) {
	base := synthetic()
	only := func(keep func(experiment.Run) bool, change func(*experiment.Run)) experiment.Results {
		res := base
		res.Runs = nil
		for _, r := range base.Runs {
			if keep(r) {
				if change != nil {
					change(&r)
				}
				res.Runs = append(res.Runs, r)
			}
		}
		return res
	}
	redis := func(r experiment.Run) bool { return r.Workload == "redis" }
	for _, c := range []struct {
		name    string
		res     experiment.Results
		drawn   []string
		omitted map[string]string // kind: words of the reason
	}{
		{
			name:  "no prediction",
			res:   only(redis, func(r *experiment.Run) { r.Predicted = nil }),
			drawn: []string{figTimeline, figDowntime, figRounds, figClient},
			omitted: map[string]string{
				figPredicted: "No run carries a prediction",
			},
		},
		{
			name:    "no client",
			res:     only(redis, func(r *experiment.Run) { r.Client = nil }),
			drawn:   []string{figTimeline, figDowntime, figRounds, figPredicted},
			omitted: map[string]string{figClient: "No run has a service client"},
		},
		{
			name: "client without timeline",
			res: only(redis, func(r *experiment.Run) {
				c := *r.Client // shared with the other cases
				c.Timeline = nil
				r.Client = &c
			}),
			drawn:   []string{figTimeline, figDowntime, figRounds, figPredicted},
			omitted: map[string]string{figClient: "No completed run has a client timeline"},
		},
		{
			name:    "cold and post-copy only",
			res:     only(func(r experiment.Run) bool { return redis(r) && (r.Mode == "cold" || r.Mode == "postcopy") }, nil),
			drawn:   []string{figTimeline, figDowntime, figClient, figPredicted},
			omitted: map[string]string{figRounds: "No completed run sent memory in rounds"},
		},
		{
			name:  "no phases recorded",
			res:   only(redis, func(r *experiment.Run) { r.Phases = nil }),
			drawn: []string{figDowntime, figRounds, figClient, figPredicted},
			omitted: map[string]string{
				figTimeline: "No completed run recorded its phases",
			},
		},
		{
			name:  "every run failed early",
			res:   only(redis, func(r *experiment.Run) { *r = experiment.Run{Point: r.Point, Repeat: r.Repeat, Error: "lab down"} }),
			drawn: nil,
			omitted: map[string]string{
				figTimeline:  "No completed run recorded its phases",
				figDowntime:  "No run completed",
				figRounds:    "No completed run sent memory in rounds",
				figClient:    "No run has a service client",
				figPredicted: "No run carries a prediction",
			},
		},
		{
			name:  "predictions on failed runs only",
			res:   only(redis, func(r *experiment.Run) { r.OK = false; r.Error = "restore failed" }),
			drawn: nil,
			omitted: map[string]string{
				figPredicted: "Only failed runs carry a prediction",
				figClient:    "No completed run has a client timeline",
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, doc := write(t, c.res)
			pv := inspect(t, doc)
			for _, k := range c.drawn {
				if pv.figures["w-redis-"+k] == nil {
					t.Errorf("%s is not drawn: %q", k, pv.omitted["w-redis-"+k])
				}
			}
			for k, why := range c.omitted {
				id := "w-redis-" + k
				if pv.figures[id] != nil {
					t.Errorf("%s is drawn", k)
				}
				if !strings.Contains(pv.omitted[id], why) {
					t.Errorf("%s: omitted for %q, want %q", k, pv.omitted[id], why)
				}
			}
			if len(all(doc, func(n *html.Node) bool { return n.Data == "table" && attr(n, "class") == "points" })) != 1 {
				t.Error("no table of points")
			}
		})
	}
}

func TestEmptyResults(t *testing.T) {
	page, doc := write(t, experiment.Results{})
	if len(inspect(t, doc).order) != 0 {
		t.Error("figures without runs")
	}
	if !bytes.Contains(page, []byte("The results hold no runs")) {
		t.Error("the page does not say there are no runs")
	}
	if !strings.Contains(textOf(all(doc, tag("h1"))[0]), "ferry experiment") {
		t.Error("an unnamed experiment has no title")
	}
}

// Odd runs: a phase left open, a client whose clock is missing, an
// unknown phase, a round index past the others.
func TestOddRuns(t *testing.T) {
	res := synthetic()
	var runs []experiment.Run
	for _, r := range res.Runs {
		if r.Workload != "redis" || r.StateBytes != 1<<30 {
			continue
		}
		r.Phases = append(slices.Clone(r.Phases), engine.PhaseSpan{Name: "teleport", StartMs: r.TotalMs})        // open
		r.Phases = append(r.Phases, engine.PhaseSpan{Name: "round-x", StartMs: r.TotalMs, EndMs: r.TotalMs + 1}) // no number
		c := *r.Client
		c.StartUnixMs = 0
		r.Client = &c
		runs = append(runs, r)
	}
	res.Runs = runs
	_, doc := write(t, res)
	pv := inspect(t, doc)
	for _, k := range allKinds {
		if pv.figures["w-redis-"+k] == nil {
			t.Errorf("%s not drawn: %q", k, pv.omitted["w-redis-"+k])
		}
	}
	if got := textOf(pv.figures["w-redis-timeline"]); !strings.Contains(got, "teleport") {
		t.Error("an unknown phase is not in the legend")
	}
	got := textOf(pv.figures["w-redis-client"])
	if !strings.Contains(got, "time since the client started") || !strings.Contains(got, "4 of the runs lack a start time") {
		t.Errorf("unaligned clocks are not said: %q", got)
	}
}

// Text from the results is escaped, never markup.
func TestEscapes(t *testing.T) {
	res := experiment.Results{Name: "<script>alert(1)</script>", Machine: `"quoted" & <b>`}
	r := synthetic().Runs[0]
	r.Workload = "<img src=x>"
	r.OK, r.Error = false, "<script>boom</script>"
	res.Runs = []experiment.Run{r}
	page, doc := write(t, res)
	if len(all(doc, tag("script"))) != 0 || len(all(doc, tag("img"))) != 0 {
		t.Error("text from the results became markup")
	}
	if !bytes.Contains(page, []byte("&lt;script&gt;boom&lt;/script&gt;")) {
		t.Error("the error is not shown escaped")
	}
}

func TestRepresentatives(t *testing.T) {
	mk := func(mode string, state int64, total float64, ok bool) experiment.Run {
		return experiment.Run{Point: experiment.Point{Workload: "w", Mode: mode, StateBytes: state}, TotalMs: total, OK: ok}
	}
	runs := []experiment.Run{
		// 1 MiB: both modes; 2 MiB: cold only, so 1 MiB is the setting.
		mk("cold", 1, 30, true), mk("cold", 1, 10, true), mk("cold", 1, 20, true), mk("cold", 1, 1, false),
		mk("hybrid", 1, 40, true), mk("hybrid", 1, 60, true), mk("hybrid", 1, 50, true), mk("hybrid", 1, 70, true),
		mk("cold", 2, 99, true),
	}
	w := group(runs)[0]
	setting, reps := w.representatives(func(r experiment.Run) bool { return r.OK })
	if setting.StateBytes != 1 || setting.Mode != "" {
		t.Fatalf("setting %+v", setting)
	}
	if len(reps) != 2 || reps[0].run.TotalMs != 20 || reps[0].of != 3 || reps[1].run.TotalMs != 50 || reps[1].of != 4 {
		t.Errorf("representatives %+v; want cold's 20 of 3, hybrid's 50 of 4 (the lower middle)", reps)
	}
	// On a tie of modes, the larger state.
	runs = append(runs, mk("hybrid", 2, 5, true))
	if setting, _ := group(runs)[0].representatives(func(r experiment.Run) bool { return r.OK }); setting.StateBytes != 2 {
		t.Errorf("tie: setting %+v, want the 2-byte state", setting)
	}
	if _, reps := w.representatives(func(experiment.Run) bool { return false }); reps != nil {
		t.Error("representatives with nothing fitting")
	}
}

func TestGroupOrder(t *testing.T) {
	p := func(wl, mode string, state int64) experiment.Run {
		return experiment.Run{Point: experiment.Point{Workload: wl, Runtime: "runc", Mode: mode, StateBytes: state}}
	}
	ws := group([]experiment.Run{p("b", "hybrid", 2), p("a", "zeta", 1), p("b", "cold", 2), p("b", "cold", 1), p("b", "hybrid", 2)})
	if len(ws) != 2 || ws[0].name != "b" || ws[1].name != "a" {
		t.Fatalf("workloads not in the order they ran")
	}
	var got []string
	for _, pt := range ws[0].points {
		got = append(got, fmt.Sprintf("%s/%d/%d", pt.Mode, pt.StateBytes, len(pt.runs)))
	}
	if want := []string{"cold/1/1", "cold/2/1", "hybrid/2/2"}; !slices.Equal(got, want) {
		t.Errorf("points %q, want %q", got, want)
	}
	if !slices.Equal(ws[0].modes, []string{"cold", "hybrid"}) || !ws[0].varies.state || ws[0].varies.runtime {
		t.Errorf("modes %q, varies %+v", ws[0].modes, ws[0].varies)
	}
}

func TestFormats(t *testing.T) {
	for in, want := range map[int64]string{64 << 20: "64 MiB", 1 << 30: "1 GiB", 1536 << 20: "1.5 GiB", 100: "100 B"} {
		if got := formatBytes(in); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int64]string{0: "unshaped", 1_000_000_000: "1 Gbit/s", 300_000_000: "300 Mbit/s", 2_500_000_000: "2.5 Gbit/s"} {
		if got := formatRate(in); got != want {
			t.Errorf("formatRate(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{1234.4: "1234", 56.78: "56.8", 3.14159: "3.14"} {
		if got := formatMs(in); got != want {
			t.Errorf("formatMs(%v) = %q, want %q", in, got, want)
		}
	}
	if slug("Redis 7 / Fast!") != "redis-7-fast" || slug("") != "x" {
		t.Error("slug")
	}
}

// A client result with no bucket width cannot be drawn; it must not
// divide by zero into the figure.
func TestClientWithoutBucketWidth(t *testing.T) {
	res := synthetic()
	for i := range res.Runs {
		if res.Runs[i].Client != nil {
			c := *res.Runs[i].Client
			c.BucketMs = 0
			res.Runs[i].Client = &c
		}
	}
	_, doc := write(t, res)
	if got := inspect(t, doc).omitted["w-redis-client"]; !strings.Contains(got, "No completed run has a client timeline") {
		t.Errorf("omitted for %q", got)
	}
}

// With --mode auto held to the results, the report has its table: one row
// per point, each disagreement marked, and the summary.
func TestAutoSection(t *testing.T) {
	res := synthetic()
	if _, doc := write(t, res); byID(doc, "auto") != nil {
		t.Error("an auto section without checks")
	}
	p := res.Runs[0].Point
	p.Mode = ""
	res.Auto = []experiment.AutoCheck{
		{Point: p, Picked: "precopy", Measured: "precopy", Agree: true},
		{Point: p, Picked: "cold", Measured: "", Agree: false},
	}
	res.BudgetMs = 500
	_, doc := write(t, res)
	sec := byID(doc, "auto")
	if sec == nil {
		t.Fatal("no auto section")
	}
	rows := all(sec, tag("tr"))
	if len(rows) != 3 {
		t.Fatalf("%d rows, want a header and 2", len(rows))
	}
	text := textOf(sec)
	for _, want := range []string{"at 1 of 2 points (a 500 ms budget)", "none within the budget", p.Workload + ": "} {
		if !strings.Contains(text, want) {
			t.Errorf("auto section lacks %q: %s", want, text)
		}
	}
	if bad := all(sec, func(n *html.Node) bool { return attr(n, "class") == "bad" }); len(bad) != 1 {
		t.Errorf("%d disagreements marked, want 1", len(bad))
	}
}
