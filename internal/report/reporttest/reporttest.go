// Package reporttest opens a written HTML report in headless Chromium and
// checks that every <figure> in it rendered. It is for tests only: it
// links chromedp, which no package of the ferry binary imports.
package reporttest

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// Chromium is Debian's browser; the checks run it headless. Without it
// they skip the test.
const Chromium = "/usr/bin/chromium"

// Figure is what the page's own script finds of one <figure>.
type Figure struct {
	ID      string  `json:"id"`
	SVG     bool    `json:"svg"`
	Width   float64 `json:"width"` // of the <svg> on screen, px
	Height  float64 `json:"height"`
	Marks   int     `json:"marks"` // drawn elements with a visible box
	Texts   int     `json:"texts"` // of the marks, <text> elements
	Caption bool    `json:"caption"`
}

// Page is what a tab found of a page once it loaded.
type Page struct {
	Figures    []Figure `json:"figures"`
	FontLoaded bool     `json:"fontLoaded"` // the embedded Liberation Sans
	Width      float64  `json:"width"`      // of the whole document, px
	Height     float64  `json:"height"`
	// Requested is every address the tab asked for, the page's own included.
	Requested []string `json:"-"`
	// Screenshot is a PNG of the whole page, not just the window.
	Screenshot []byte `json:"-"`
}

// checkFigures runs in the page once its fonts are in: every figure's
// <svg>, its size on screen, and the elements drawn in it.
const checkFigures = `(async () => {
	await document.fonts.ready;
	const drawn = 'path, line, polyline, polygon, rect, circle, ellipse, text';
	const doc = document.documentElement;
	return {
		fontLoaded: [...document.fonts].some(f => f.family.replace(/["']/g, '') === 'Liberation Sans' && f.status === 'loaded'),
		width: doc.scrollWidth,
		height: doc.scrollHeight,
		figures: [...document.querySelectorAll('figure')].map(f => {
			const svg = f.querySelector('svg');
			const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
			let marks = 0, texts = 0;
			for (const el of svg ? svg.querySelectorAll(drawn) : []) {
				const b = el.getBoundingClientRect();
				if (b.width > 0 || b.height > 0) {
					marks++;
					if (el.tagName.toLowerCase() === 'text') texts++;
				}
			}
			return {id: f.id, svg: !!svg, width: box.width, height: box.height, marks, texts, caption: !!f.querySelector('figcaption')};
		}),
	};
})()`

// Problems says what is wrong with each figure as the browser drew it,
// by figure id; a figure drawn right has no entry.
func Problems(figs []Figure) map[string]string {
	out := map[string]string{}
	for i, f := range figs {
		id := f.ID
		if id == "" {
			id = fmt.Sprintf("#%d (no id)", i+1)
		}
		switch {
		case !f.SVG:
			out[id] = "no <svg>"
		case f.Width <= 0 || f.Height <= 0:
			out[id] = fmt.Sprintf("drawn %v × %v px", f.Width, f.Height)
		case f.Marks < 10 || f.Texts < 3:
			out[id] = fmt.Sprintf("only %d elements drawn, %d of them text", f.Marks, f.Texts)
		case !f.Caption:
			out[id] = "no caption"
		}
	}
	return out
}

// Browser starts headless Chromium for the test, to be stopped when it
// ends, and returns a context that opens pages in it. It skips the test
// if there is no Chromium.
func Browser(t testing.TB) context.Context {
	t.Helper()
	if _, err := os.Stat(Chromium); err != nil {
		t.Skipf("no browser to open the report in: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	// Chromium keeps its profile and, in $TMPDIR, its singleton socket's
	// directory, which a killed browser leaves behind: both in the test's
	// own temporary directory.
	tmp := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(Chromium),
		chromedp.NoSandbox, // root has no sandbox
		chromedp.DisableGPU, chromedp.WindowSize(1200, 900),
		chromedp.UserDataDir(filepath.Join(tmp, "profile")), chromedp.Env("TMPDIR="+tmp))
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	b, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(b); err != nil {
		t.Fatalf("starting %s: %v", Chromium, err)
	}
	return b
}

// Open loads a file in a new tab of the browser and returns what the page
// found, every address the tab asked for, and a full-page screenshot.
func Open(t testing.TB, browser context.Context, path string) Page {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var requested []string
	tab, cancel := chromedp.NewContext(browser, chromedp.WithListener(func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			requested = append(requested, e.Request.URL)
			mu.Unlock()
		}
	}))
	defer cancel()
	if err := chromedp.Do(tab, chromedp.Navigate("file://"+abs)); err != nil {
		t.Fatalf("opening %s: %v", abs, err)
	}
	found, err := chromedp.Run(tab, chromedp.Evaluate[Page](checkFigures, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("checking the figures of %s: %v", abs, err)
	}
	found.Screenshot, err = chromedp.Run(tab, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot of %s: %v", abs, err)
	}
	mu.Lock()
	defer mu.Unlock()
	found.Requested = append([]string(nil), requested...)
	return found
}

// CheckInBrowser opens the HTML report at htmlPath in headless Chromium,
// writes a full-page screenshot (PNG) to screenshotPath, and reports as
// test errors: a screenshot that does not decode, is not of the whole
// page, or is nearly blank; each figure that did not render (no <svg>, no
// size, too few elements or texts drawn, no caption), naming it and what
// is wrong; a <figure> in the file the browser did not find; the embedded
// font not loaded; and any request other than file:// or data:. It
// returns how many figures it checked; whether that is enough is the
// caller's to say. It skips the test if there is no Chromium.
func CheckInBrowser(t testing.TB, htmlPath, screenshotPath string) (figures int) {
	t.Helper()
	b := Browser(t)
	html, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	page := Open(t, b, htmlPath)

	if err := os.WriteFile(screenshotPath, page.Screenshot, 0o644); err != nil {
		t.Fatal(err)
	}
	checkScreenshot(t, page, screenshotPath)

	in := bytes.Count(html, []byte("<figure ")) + bytes.Count(html, []byte("<figure>"))
	if len(page.Figures) != in {
		t.Errorf("%s: the browser found %d figures, the file has %d", htmlPath, len(page.Figures), in)
	}
	for id, p := range Problems(page.Figures) {
		t.Errorf("%s: figure %s: %s", htmlPath, id, p)
	}
	if !page.FontLoaded {
		t.Errorf("%s: the embedded Liberation Sans did not load", htmlPath)
	}
	for _, u := range page.Requested {
		if !strings.HasPrefix(u, "file://") && !strings.HasPrefix(u, "data:") {
			t.Errorf("%s: the page fetched %s", htmlPath, u)
		}
	}
	return len(page.Figures)
}

// checkScreenshot checks the page's screenshot, written at path: a PNG of
// the whole page with a fair share of it not white.
func checkScreenshot(t testing.TB, page Page, path string) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(page.Screenshot))
	if err != nil {
		t.Errorf("the screenshot %s is no PNG: %v", path, err)
		return
	}
	size := img.Bounds().Size()
	if float64(size.X) < page.Width || float64(size.Y) < page.Height {
		t.Errorf("the screenshot %s is %v, the page %v × %v", path, size, page.Width, page.Height)
	}
	inked, sampled := 0, 0
	for y := 0; y < size.Y; y += 8 {
		for x := 0; x < size.X; x += 8 {
			r, g, b, _ := img.At(x, y).RGBA()
			sampled++
			if r < 0xf000 || g < 0xf000 || b < 0xf000 {
				inked++
			}
		}
	}
	if sampled == 0 || inked*100 < sampled {
		t.Errorf("the screenshot %s is nearly blank: %d of %d samples inked", path, inked, sampled)
	}
	t.Logf("screenshot %v of a page %v × %v at %s, %d of %d samples inked",
		size, page.Width, page.Height, path, inked, sampled)
}
