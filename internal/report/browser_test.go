package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/report/reporttest"
)

func TestReportInBrowser(t *testing.T) {
	dir := t.TempDir()
	var page bytes.Buffer
	if err := Write(&page, synthetic()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "report.html")
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := reporttest.CheckInBrowser(t, path, filepath.Join(dir, "report.png")); n != 9 {
		t.Errorf("the browser checked %d figures, want 9", n)
	}
}

// The check must catch a broken figure: an empty drawing, one of no size,
// one missing.
func TestBrowserCheckCatchesBrokenFigures(t *testing.T) {
	b := reporttest.Browser(t)
	var page bytes.Buffer
	if err := Write(&page, synthetic()); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	// svgOf finds the <svg> element of the figure with the id.
	svgOf := func(id string) (start, end int) {
		at := strings.Index(html, `<figure id="`+id+`"`)
		if at < 0 {
			t.Fatalf("no figure %s", id)
		}
		start = at + strings.Index(html[at:], "<svg")
		end = start + strings.Index(html[start:], "</svg>") + len("</svg>")
		return start, end
	}
	s, e := svgOf("w-memhog-timeline") // emptied
	head := html[s : s+strings.Index(html[s:], ">")+1]
	html = html[:s] + head + "</svg>" + html[e:]
	s, e = svgOf("w-memhog-downtime") // no size
	html = html[:s] + `<svg width="0" height="0" style="width:0;height:0"` + html[s+len("<svg"):e] + html[e:]
	s, e = svgOf("w-memhog-rounds") // gone
	html = html[:s] + html[e:]

	path := filepath.Join(t.TempDir(), "broken.html")
	if err := os.WriteFile(path, []byte(html), 0o644); err != nil {
		t.Fatal(err)
	}
	got := reporttest.Problems(reporttest.Open(t, b, path).Figures)
	for _, id := range []string{"w-memhog-timeline", "w-memhog-downtime", "w-memhog-rounds"} {
		if got[id] == "" {
			t.Errorf("%s is broken but passes", id)
		}
		delete(got, id)
	}
	for id, p := range got {
		t.Errorf("%s is intact but fails: %s", id, p)
	}
}
