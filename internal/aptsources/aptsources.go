// Package aptsources reads which Debian archives this machine's apt uses
// (deb822 .sources files, then sources.list), so that what ferry builds
// from Debian packages (the lab's root filesystems, the package tests'
// clean roots) comes from the same mirror and never a hard-coded one.
package aptsources

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Debian's own redirector, which Mirrors falls back to.
const (
	DefaultMirror   = "http://deb.debian.org/debian"
	DefaultSecurity = "http://deb.debian.org/debian-security"
)

// Paths are where apt's sources are read from; tests point them elsewhere.
type Paths struct {
	// SourcesDir holds deb822 *.sources files (debian.sources read first:
	// it is the system's own).
	SourcesDir string
	// SourcesList is the one-line-style list.
	SourcesList string
}

// System are apt's own paths.
var System = Paths{SourcesDir: "/etc/apt/sources.list.d", SourcesList: "/etc/apt/sources.list"}

// Find returns the Debian archive and security archive URLs the sources
// under p name (the first http(s) source of a -security suite is the
// security archive, the first other one the archive). security is empty
// when no -security suite is listed; an error says that no archive is.
func Find(p Paths) (mirror, security string, err error) {
	mirror, security = pick(p.read())
	if mirror == "" {
		return "", security, fmt.Errorf("no http(s) Debian archive in %s/*.sources nor %s", p.SourcesDir, p.SourcesList)
	}
	return mirror, security, nil
}

// Mirrors is Find over the system's sources, with Debian's redirector for
// what they do not name.
func Mirrors() (mirror, security string) {
	mirror, security = pick(System.read())
	if mirror == "" {
		mirror = DefaultMirror
	}
	if security == "" {
		security = DefaultSecurity
	}
	return mirror, security
}

// read parses every source under p, debian.sources first.
func (p Paths) read() []source {
	var stanzas []source
	files, _ := filepath.Glob(filepath.Join(p.SourcesDir, "*.sources"))
	slices.SortStableFunc(files, func(a, b string) int {
		return boolInt(filepath.Base(b) == "debian.sources") - boolInt(filepath.Base(a) == "debian.sources")
	})
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			stanzas = append(stanzas, parseDeb822(string(b))...)
		}
	}
	if b, err := os.ReadFile(p.SourcesList); err == nil {
		stanzas = append(stanzas, parseOneLine(string(b))...)
	}
	return stanzas
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// source is one source of binary packages.
type source struct {
	URIs   []string
	Suites []string
}

// parseDeb822 reads the stanzas of a .sources file that give binary
// packages ("Types: deb").
func parseDeb822(text string) []source {
	var out []source
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r", ""), "\n\n") {
		fields := map[string]string{}
		key := ""
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if (line[0] == ' ' || line[0] == '\t') && key != "" {
				fields[key] += " " + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			fields[key] = strings.TrimSpace(v)
		}
		if !slices.Contains(strings.Fields(fields["types"]), "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		out = append(out, source{URIs: strings.Fields(fields["uris"]), Suites: strings.Fields(fields["suites"])})
	}
	return out
}

// parseOneLine reads "deb [options] URI SUITE COMPONENTS..." lines.
func parseOneLine(text string) []source {
	var out []source
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 {
			out = append(out, source{URIs: f[:1], Suites: f[1:2]})
		}
	}
	return out
}

// pick takes the first source of a -security suite as the security
// archive and the first other one as the archive; either may be empty.
func pick(sources []source) (mirror, security string) {
	for _, s := range sources {
		if len(s.URIs) == 0 || len(s.Suites) == 0 {
			continue
		}
		uri := strings.TrimRight(s.URIs[0], "/")
		if !strings.HasPrefix(uri, "http://") && !strings.HasPrefix(uri, "https://") {
			continue
		}
		isSecurity := slices.ContainsFunc(s.Suites, func(x string) bool { return strings.HasSuffix(x, "-security") })
		if isSecurity && security == "" {
			security = uri
		} else if !isSecurity && mirror == "" {
			mirror = uri
		}
	}
	return mirror, security
}

// Reachable asks mirror for suite's release file, within timeout.
func Reachable(ctx context.Context, mirror, suite string, timeout time.Duration) error {
	if mirror == "" {
		return errors.New("no mirror")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := mirror + "/dists/" + suite + "/InRelease"
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
