package images

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/creds"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"google.golang.org/protobuf/proto"
)

// The core images' magic, and the one service images start with instead
// of the common one.
var (
	magicService = uint32(magics.ByName["IMG_SERVICE"])
	magicCore    = uint32(magics.ByName["CORE"])
)

// maxCoreEntry bounds a core image's entry (a task's registers, signals,
// credentials: a few KiB).
const maxCoreEntry = 1 << 20

// TaskCaps reads each task's credentials from the core images in dir and
// returns, by pid, the union of its permitted, effective, inheritable and
// bounding capability sets (bit n for capability n).
func TaskCaps(dir string) (map[int]uint64, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return nil, err
	}
	out := map[int]uint64{}
	for _, path := range paths {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "core-"), ".img"))
		if err != nil {
			return nil, fmt.Errorf("%s: not a task's core image", filepath.Base(path))
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		caps, err := decodeCoreCaps(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		out[pid] = caps
	}
	return out, nil
}

// decodeCoreCaps decodes a core image's bytes down to its task's
// capability sets.
func decodeCoreCaps(b []byte) (uint64, error) {
	if len(b) < 8 || (binary.LittleEndian.Uint32(b) != magicCommon && binary.LittleEndian.Uint32(b) != magicService) ||
		binary.LittleEndian.Uint32(b[4:]) != magicCore {
		return 0, fmt.Errorf("not a CRIU core image")
	}
	b = b[8:]
	var caps uint64
	n := 0
	for len(b) > 0 {
		if len(b) < 4 {
			return 0, fmt.Errorf("truncated entry")
		}
		size := binary.LittleEndian.Uint32(b)
		if size > maxCoreEntry || int(size) > len(b)-4 {
			return 0, fmt.Errorf("entry of %d bytes", size)
		}
		var core criucore.CoreEntry
		if err := proto.Unmarshal(b[4:4+size], &core); err != nil {
			return 0, err
		}
		cr := core.GetThreadCore().GetCreds()
		if cr == nil {
			return 0, fmt.Errorf("a task without credentials")
		}
		for _, set := range [][]uint32{cr.GetCapPrm(), cr.GetCapEff(), cr.GetCapInh(), cr.GetCapBnd()} {
			for i, w := range set {
				if i < 2 {
					caps |= uint64(w) << (32 * i)
				}
			}
		}
		b = b[4+size:]
		n++
	}
	if n == 0 {
		return 0, fmt.Errorf("no entry")
	}
	return caps, nil
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
