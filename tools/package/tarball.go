package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tarOptions say which tarball to write.
type tarOptions struct {
	Root, Bin     string
	Version, Arch string
	Out           string
	MTime         time.Time
}

// tarFiles are the tarball's files under its top directory. A source
// starting with @ is in the architecture's build (--bin), any other in the
// repository; a * in it takes every match, into the directory dst.
var tarFiles = []struct {
	dst, src string
	mode     int64
}{
	{"ferry", "@ferry", 0o755},
	{"ferry-controller", "@ferry-controller", 0o755},
	{"docker-runc", "internal/runtime/docker/ferry-runc.sh", 0o755},
	{"man/", "@man/*.1", 0o644},
	{"completion/ferry.bash", "@completion/ferry.bash", 0o644},
	{"systemd/ferry-agent.service", "packaging/systemd/ferry-agent.service", 0o644},
	{"systemd/run-criu.mount", "packaging/systemd/run-criu.mount", 0o644},
	{"sysctl.d/50-ferry.conf", "packaging/sysctl.d/50-ferry.conf", 0o644},
	{"tmpfiles.d/ferry.conf", "packaging/tmpfiles.d/ferry.conf", 0o644},
	{"agent.toml", "packaging/agent.toml", 0o644},
	{"LICENSE", "LICENSE", 0o644},
	{"DEPLOY.md", "docs/DEPLOY.md", 0o644},
}

// tarballName is the tarball's top directory, and its name without .tar.gz.
func tarballName(version, arch string) string {
	return fmt.Sprintf("ferry-%s-linux-%s", debVersion(version), arch)
}

// writeTarball writes OUT/ferry-VERSION-linux-ARCH.tar.gz: sorted entries,
// every one owned by root and dated o.MTime, gzip without a name or a
// time, so that the same inputs give the same bytes.
func writeTarball(o tarOptions) (string, error) {
	if o.Arch == "" || o.Version == "" || o.Bin == "" {
		return "", errors.New("tarball needs --arch, --version and --bin")
	}
	type entry struct {
		name, src string
		mode      int64
	}
	top := tarballName(o.Version, o.Arch)
	var entries []entry
	dirs := map[string]bool{top + "/": true}
	for _, f := range tarFiles {
		src := filepath.Join(o.Root, f.src)
		if strings.HasPrefix(f.src, "@") {
			src = filepath.Join(o.Bin, f.src[1:])
		}
		srcs := []string{src}
		if strings.Contains(src, "*") {
			m, err := filepath.Glob(src)
			if err != nil || len(m) == 0 {
				return "", fmt.Errorf("%s: no files (%v)", src, err)
			}
			srcs = m
		}
		for _, s := range srcs {
			name := path.Join(top, f.dst)
			if strings.HasSuffix(f.dst, "/") {
				name = path.Join(name, filepath.Base(s))
			}
			for d := path.Dir(name); d != top; d = path.Dir(d) {
				dirs[d+"/"] = true
			}
			entries = append(entries, entry{name, s, f.mode})
		}
	}
	for d := range dirs {
		entries = append(entries, entry{name: d, mode: 0o755})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })

	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(o.Out, top+".tar.gz")
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	err = func() error {
		zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
		if err != nil {
			return err
		}
		tw := tar.NewWriter(zw)
		for _, e := range entries {
			h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: o.MTime, Uname: "root", Gname: "root", Format: tar.FormatUSTAR}
			if e.src == "" {
				h.Typeflag = tar.TypeDir
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				continue
			}
			if err := copyInto(tw, h, e.src); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return zw.Close()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return "", err
	}
	return out, nil
}

// copyInto writes the regular file src into tw under h.
func copyInto(tw *tar.Writer, h *tar.Header, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	h.Typeflag = tar.TypeReg
	h.Size = st.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
