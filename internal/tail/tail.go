// Package tail keeps the end of a tool's output or log, which is where
// tools say why they failed, for error messages.
package tail

import (
	"os"
	"strings"
)

// Lines returns the last n lines of s, surrounding blank space trimmed.
func Lines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// File returns the last n lines of the file at path, "" when unreadable.
func File(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return Lines(string(b), n)
}
