package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"
)

// applyConfig sets, from the TOML file at path, every flag of fs that the
// command line left alone: the file's keys are the flags' names without
// the dashes (listen = ["0.0.0.0:7070"], tls-dir = "/etc/ferry/tls",
// outage-timeout = "30s"). A key that names no flag is an error, so a typo
// does not pass silently.
func applyConfig(fs *pflag.FlagSet, path string) error {
	var m map[string]any
	if _, err := toml.DecodeFile(path, &m); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil || k == "config" || k == "help" {
			return fmt.Errorf("config %s: unknown setting %q (settings are the agent's flags without the dashes; see ferry agent --help)", path, k)
		}
		if f.Changed {
			continue // the command line wins
		}
		var err error
		switch v := m[k].(type) {
		case []any:
			vals := make([]string, len(v))
			for i, x := range v {
				vals[i] = fmt.Sprint(x)
			}
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				err = sv.Replace(vals)
			} else {
				err = f.Value.Set(strings.Join(vals, ","))
			}
		case map[string]any:
			err = fmt.Errorf("a table, want a value")
		default:
			err = f.Value.Set(fmt.Sprint(v))
		}
		if err != nil {
			return fmt.Errorf("config %s: %s: %w", path, k, err)
		}
	}
	return nil
}

// Files of a configuration directory (--config DIR): settings every host
// shares, then the host's own, which win; as a ConfigMap mounted in the
// agent's pod holds them, one key per file.
const commonConfig = "agent.toml"

// applyConfigPath applies path: a file, or a directory holding
// agent.toml and NAME.toml (either may be missing, not both), NAME being
// --name as the command line or agent.toml set it, else the hostname.
func applyConfigPath(fs *pflag.FlagSet, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if !st.IsDir() {
		return applyConfig(fs, path)
	}
	common := filepath.Join(path, commonConfig)
	found := false
	if _, err := os.Stat(common); err == nil {
		if err := applyConfig(fs, common); err != nil {
			return err
		}
		found = true
	}
	name := fs.Lookup("name").Value.String()
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return err
		}
	}
	own := filepath.Join(path, name+".toml")
	if _, err := os.Stat(own); err == nil {
		if err := applyConfig(fs, own); err != nil {
			return err
		}
		found = true
	}
	if !found {
		return fmt.Errorf("--config %s: a directory with neither %s nor %s.toml (this host's own settings)", path, commonConfig, name)
	}
	return nil
}
