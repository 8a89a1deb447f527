package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/preflight"
	"github.com/ferry-migrate/ferry/internal/runtime/all"
)

// Set at build time (the Makefile: -ldflags "-X main.version=... -X
// main.commit=...").
var version, commit = "dev", ""

// versionInfo is `ferry version --json`: this build, and the CRIU and
// runtimes it would drive here (null: not installed).
type versionInfo struct {
	Version  string             `json:"version"`
	Commit   string             `json:"commit,omitempty"`
	Go       string             `json:"go"`
	CRIU     *string            `json:"criu"`
	Runtimes preflight.Runtimes `json:"runtimes"`
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print ferry's version, and the CRIU and runtimes it finds here",
		Long: `version prints this build of ferry (version, commit, Go) and the versions of
CRIU and of the container runtimes (runc, Podman, LXC, ...) installed on this
host, as ferry check finds them. ferry --version prints the first line only.`,
		Example: `  ferry version
  ferry version --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			v := versionInfo{Version: version, Commit: commit, Go: runtime.Version()}
			if cv, err := criu.InstalledVersion(ctx); err == nil {
				s := cv.String()
				v.CRIU = &s
			}
			v.Runtimes = preflight.Runtimes{}
			for _, g := range all.Registry.All() {
				if len(g.Tools) == 0 {
					continue
				}
				v.Runtimes[g.Kind] = nil
				if rv, ok := preflight.RuntimeVersion(ctx, g.Kind); ok {
					v.Runtimes[g.Kind] = &rv
				}
			}
			if asJSON {
				return cli.PrintJSON(v)
			}
			fmt.Println(versionLine())
			fmt.Printf("go       %s\n", v.Go)
			show := func(name string, s *string) {
				if s == nil {
					fmt.Printf("%-8s not installed\n", name)
				} else {
					fmt.Printf("%-8s %s\n", name, *s)
				}
			}
			show("criu", v.CRIU)
			for _, g := range all.Registry.All() {
				if s, ok := v.Runtimes[g.Kind]; ok {
					show(g.Kind, s)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.SetOut(os.Stdout)
	return cmd
}

// versionLine is this build in one line.
func versionLine() string { return cli.VersionLine("ferry", version, commit) }
