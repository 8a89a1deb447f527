package reporttest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder keeps the errors a check reports instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Error(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// CheckInBrowser must report what is wrong with a page: a figure with no
// drawing, one the browser does not see, no embedded font, a request
// off the machine, a blank screenshot.
func TestCheckInBrowserReportsABadPage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.html")
	page := `<!doctype html><html><body>
<figure id="empty"><svg width="100" height="100"></svg><figcaption>empty</figcaption></figure>
<template><figure id="unseen"></figure></template>
<img src="http://127.0.0.1:9/off.png">
</body></html>`
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	shot := filepath.Join(dir, "bad.png")
	if n := CheckInBrowser(r, path, shot); n != 1 {
		t.Errorf("checked %d figures, want 1", n)
	}
	if _, err := os.Stat(shot); err != nil {
		t.Errorf("no screenshot: %v", err)
	}
	for _, want := range []string{
		"figure empty: only 0 elements drawn",
		"the browser found 1 figures, the file has 2",
		"Liberation Sans did not load",
		"the page fetched http://127.0.0.1:9/off.png",
		"nearly blank",
	} {
		found := false
		for _, e := range r.errs {
			found = found || strings.Contains(e, want)
		}
		if !found {
			t.Errorf("no error says %q; the errors: %q", want, r.errs)
		}
	}
	if len(r.errs) != 5 {
		t.Errorf("%d errors, want 5: %q", len(r.errs), r.errs)
	}
}
