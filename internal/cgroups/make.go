package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Make creates rel (and its parents) in every cgroup hierarchy. In
// the cpuset hierarchy a new cgroup starts with no CPUs and no memory
// nodes, and a process could not join it: it gets its parent's.
func Make(rel string) error {
	for _, h := range Hierarchies(Root) {
		parts := strings.Split(strings.Trim(rel, "/"), "/")
		dir := h
		for _, p := range parts {
			parent := dir
			dir = filepath.Join(dir, p)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if err := inheritFile(parent, dir, f); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// inheritFile copies file from parent to dir when dir has it empty.
func inheritFile(parent, dir, file string) error {
	cur, err := os.ReadFile(filepath.Join(dir, file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // another hierarchy
	}
	if err != nil || strings.TrimSpace(string(cur)) != "" {
		return err
	}
	val, err := os.ReadFile(filepath.Join(parent, file))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, file), val, 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, file), err)
	}
	return nil
}

// Join moves pid into rel in every hierarchy where rel exists.
func Join(rel string, pid int) error {
	var errs []error
	for _, h := range Hierarchies(Root) {
		procsFile := filepath.Join(h, rel, "cgroup.procs")
		if _, err := os.Stat(procsFile); err != nil {
			continue
		}
		if err := os.WriteFile(procsFile, []byte(fmt.Sprint(pid)), 0); err != nil {
			errs = append(errs, fmt.Errorf("move %d into %s: %w", pid, procsFile, err))
		}
	}
	return errors.Join(errs...)
}

// Remove removes the empty cgroup rel from every hierarchy that has it.
func Remove(rel string) error {
	var errs []error
	for _, h := range Hierarchies(Root) {
		if err := os.Remove(filepath.Join(h, rel)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
