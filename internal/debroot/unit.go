package debroot

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// unitDirs are where systemd looks for a system unit, the first found
// winning: the administrator's, the runtime's, the packages'.
var unitDirs = []string{"etc/systemd/system", "run/systemd/system", "lib/systemd/system", "usr/lib/systemd/system"}

// UnitPath is the file of the system unit name inside root, as systemd
// would pick it; an error wrapping fs.ErrNotExist when there is none.
func UnitPath(root, name string) (string, error) {
	for _, d := range unitDirs {
		p := filepath.Join(root, d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no unit %s in %s (%s): %w", name, root, strings.Join(unitDirs, ", "), fs.ErrNotExist)
}

// Unit is a unit file's settings: section, then key, then each value in
// order (a key may repeat; an empty assignment resets it, as in systemd).
type Unit map[string]map[string][]string

// Get is the last value of key in section, "" if unset.
func (u Unit) Get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// ReadUnit parses a unit file (comments, sections, KEY=VALUE lines, a
// trailing backslash continuing a line).
func ReadUnit(path string) (Unit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u := Unit{}
	section, cont := "", ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cont != "" {
			line = cont + " " + line
			cont = ""
		}
		if strings.HasSuffix(line, `\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return nil, fmt.Errorf("%s:%d: not KEY=VALUE in a section: %q", path, n, line)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if v == "" {
				u[section][k] = nil
				continue
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u, sc.Err()
}

// ExecStart is the command line the service unit in root starts, split
// as systemd splits it: the installed ferry-agent.service's, to start an
// agent from a root exactly so. Prefixes that change only how systemd
// treats a failure (-, +, !, !!, :) are dropped; specifiers (%i) and
// environment variables ($X), which systemd would expand, are refused.
func ExecStart(root, unit string) ([]string, error) {
	path, err := UnitPath(root, unit)
	if err != nil {
		return nil, err
	}
	u, err := ReadUnit(path)
	if err != nil {
		return nil, err
	}
	lines := u["Service"]["ExecStart"]
	if len(lines) != 1 {
		return nil, fmt.Errorf("%s: %d ExecStart= lines, want one", path, len(lines))
	}
	line := lines[0]
	for len(line) > 0 && strings.ContainsRune("-+!:", rune(line[0])) {
		line = line[1:]
	}
	if strings.HasPrefix(line, "@") {
		return nil, fmt.Errorf("%s: ExecStart=@ (a separate argv[0]) is not supported", path)
	}
	argv, err := splitCommand(line)
	if err != nil {
		return nil, fmt.Errorf("%s: ExecStart: %w", path, err)
	}
	if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
		return nil, fmt.Errorf("%s: ExecStart %q does not start with an absolute path", path, lines[0])
	}
	return argv, nil
}

// splitCommand splits a command line into words: blanks separate them,
// double or single quotes group them, a backslash escapes the next
// character.
func splitCommand(s string) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		quote   rune
		escaped bool
	)
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped, inWord = true, true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '%' || r == '$':
			return nil, fmt.Errorf("%q: specifiers and variables are not expanded here", s)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, errors.New("unterminated quote or escape in " + s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
