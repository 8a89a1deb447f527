// Package images handles CRIU image directories: moving them between hosts
// and, later, parsing and diffing their pages.
package images

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SendDir streams the regular files of a flat CRIU images directory as a tar,
// skipping names for which skip returns true (logs, for instance). It returns
// the bytes of file content sent.
func SendDir(w io.Writer, dir string, skip func(name string) bool) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	// A dump's images are dozens of small files, and every write to a
	// session channel is a frame of its own: buffered, they go in a few,
	// inside the downtime.
	bw := bufio.NewWriterSize(w, 256<<10)
	tw := tar.NewWriter(bw)
	var total int64
	for _, e := range ents {
		if !e.Type().IsRegular() || (skip != nil && skip(e.Name())) {
			continue
		}
		n, err := sendFile(tw, filepath.Join(dir, e.Name()), e.Name())
		total += n
		if err != nil {
			return total, err
		}
	}
	if err := tw.Close(); err != nil {
		return total, err
	}
	return total, bw.Flush()
}

func sendFile(tw *tar.Writer, path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: st.Size(), Typeflag: tar.TypeReg}); err != nil {
		return 0, err
	}
	return io.Copy(tw, f)
}

// ReceiveDir writes the files of a SendDir stream into dir (created 0700),
// refusing anything but plain file names.
func ReceiveDir(r io.Reader, dir string) (int64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if h.Typeflag != tar.TypeReg || !validName(h.Name) {
			return total, fmt.Errorf("images: refusing entry %q (type %c)", h.Name, h.Typeflag)
		}
		f, err := os.OpenFile(filepath.Join(dir, h.Name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return total, err
		}
		n, err := io.Copy(f, tr)
		total += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return total, err
		}
	}
}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\\\x00")
}
