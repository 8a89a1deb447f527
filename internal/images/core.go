package images

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"
)

// The core images' magic, and the one service images start with instead
// of the common one.
var (
	magicService = uint32(magics.ByName["IMG_SERVICE"])
	magicCore    = uint32(magics.ByName["CORE"])
	magicPstree  = uint32(magics.ByName["PSTREE"])
)

// maxCoreEntry bounds a core image's entry (a task's registers, signals,
// credentials: a few KiB).
const maxCoreEntry = 1 << 20

// Task is what admission checks of one task's core image.
type Task struct {
	// Caps is the union of its threads' permitted, effective,
	// inheritable and bounding capability sets (bit n for capability n).
	Caps uint64
	// Unfiltered: CRIU would restore it without a seccomp filter. A
	// process's leader's core image says its mode; a thread's says one
	// only where it differs (CRIU writes none for a thread that shares
	// its leader's filter).
	Unfiltered bool
}

// Tasks reads each task's (thread's) core image in dir, by pid.
func Tasks(dir string) (map[int]Task, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return nil, err
	}
	leaders, err := processes(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]Task{}
	for _, path := range paths {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "core-"), ".img"))
		if err != nil {
			return nil, fmt.Errorf("%s: not a task's core image", filepath.Base(path))
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		t, err := decodeCore(b, leaders == nil || leaders[pid])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		out[pid] = t
	}
	return out, nil
}

// decodeCore decodes a core image's bytes down to what Task holds; leader
// says it is a process's first thread.
func decodeCore(b []byte, leader bool) (Task, error) {
	var t Task
	n := 0
	err := eachEntry(b, magicCore, maxCoreEntry, func(e []byte) error {
		var core criucore.CoreEntry
		if err := proto.Unmarshal(e, &core); err != nil {
			return err
		}
		tc := core.GetThreadCore()
		cr := tc.GetCreds()
		if cr == nil {
			return fmt.Errorf("a task without credentials")
		}
		for _, set := range [][]uint32{cr.GetCapPrm(), cr.GetCapEff(), cr.GetCapInh(), cr.GetCapBnd()} {
			for i, w := range set {
				if i < 2 {
					t.Caps |= uint64(w) << (32 * i)
				}
			}
		}
		if (leader || tc.SeccompMode != nil) && tc.GetSeccompMode() != criucore.SeccompMode_filter {
			t.Unfiltered = true
		}
		n++
		return nil
	})
	if err == nil && n == 0 {
		err = fmt.Errorf("no entry")
	}
	return t, err
}

// maxPstreeEntry bounds a process tree entry (its ids and threads').
const maxPstreeEntry = 1 << 20

// processes lists the processes of the images in dir (pstree.img), by the
// pid of their leader; without a process tree, nil (every core image is
// then taken for a leader's).
func processes(dir string) (map[int]bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "pstree.img"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	err = eachEntry(b, magicPstree, maxPstreeEntry, func(e []byte) error {
		var p pstree.PstreeEntry
		if err := proto.Unmarshal(e, &p); err != nil {
			return err
		}
		out[int(p.GetPid())] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pstree.img: %w", err)
	}
	return out, nil
}

// eachEntry calls fn with each entry of a CRIU image's bytes b, which
// must be of kind magic, none larger than max.
func eachEntry(b []byte, magic uint32, max int, fn func([]byte) error) error {
	if len(b) < 8 || (binary.LittleEndian.Uint32(b) != magicCommon && binary.LittleEndian.Uint32(b) != magicService) ||
		binary.LittleEndian.Uint32(b[4:]) != magic {
		return fmt.Errorf("not a CRIU %s image", magics.ByValue[uint64(magic)])
	}
	for b = b[8:]; len(b) > 0; {
		if len(b) < 4 {
			return fmt.Errorf("truncated entry")
		}
		size := binary.LittleEndian.Uint32(b)
		if int64(size) > int64(max) || int(size) > len(b)-4 {
			return fmt.Errorf("entry of %d bytes", size)
		}
		if err := fn(b[4 : 4+size]); err != nil {
			return err
		}
		b = b[4+size:]
	}
	return nil
}

// EncodeTaskCaps is a core image, framed as CRIU writes one, of one task
// whose every capability set is caps, its other credentials root's (tests
// and bench hostile: images that claim capabilities).
func EncodeTaskCaps(caps uint64) ([]byte, error) {
	zero := proto.Uint32(0)
	words := []uint32{uint32(caps), uint32(caps >> 32)}
	m, err := proto.Marshal(&criucore.CoreEntry{
		Mtype: criucore.CoreEntry_X86_64.Enum(),
		ThreadCore: &criucore.ThreadCoreEntry{FutexRla: proto.Uint64(0), FutexRlaLen: zero,
			Creds: &creds.CredsEntry{Uid: zero, Gid: zero, Euid: zero, Egid: zero, Suid: zero, Sgid: zero, Fsuid: zero, Fsgid: zero, Secbits: zero,
				CapInh: words, CapPrm: words, CapEff: words, CapBnd: words}},
	})
	if err != nil {
		return nil, err
	}
	buf := binary.LittleEndian.AppendUint32(nil, magicCommon)
	buf = binary.LittleEndian.AppendUint32(buf, magicCore)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(m)))
	return append(buf, m...), nil
}
