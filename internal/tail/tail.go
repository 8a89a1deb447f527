// Package tail keeps the end of a tool's output or log, which is where
// tools say why they failed, for error messages.
package tail

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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

// Run runs c, its output going to log (if any) and kept, so that its
// error quotes the output's last n lines.
func Run(c *exec.Cmd, log io.Writer, n int) error {
	var buf bytes.Buffer
	w := io.Writer(&buf)
	if log != nil {
		w = io.MultiWriter(&buf, log)
	}
	c.Stdout, c.Stderr = w, w
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s: %w:\n%s", filepath.Base(c.Path), err, Lines(buf.String(), n))
	}
	return nil
}
