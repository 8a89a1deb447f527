package images

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"google.golang.org/protobuf/proto"
)

var magicMnts = uint32(magics.ByName["MNTS"])

// maxMountEntry bounds a mount image's entry (paths and options).
const maxMountEntry = 64 << 10

// Mount is one mount of a CRIU image's mount tree, as CRIU would make it
// again at a restore.
type Mount struct {
	ID, Parent uint32
	// Type is the kernel's name for the filesystem ("proc", "tmpfs";
	// CRIU's fsname for the kinds it does not know by number).
	Type string
	// Point is where it is mounted, Root the part of its filesystem it
	// shows, Source what the kernel was given to mount.
	Point, Root, Source string
	// External: the runtime supplies it at the restore (a bind mount of
	// the configuration's); CRIU does not mount it from the image.
	External bool
	ReadOnly bool
}

// fsTypes names CRIU's filesystem numbers (mnt.proto's fstype).
var fsTypes = map[mnt.Fstype]string{
	mnt.Fstype_PROC: "proc", mnt.Fstype_SYSFS: "sysfs", mnt.Fstype_DEVTMPFS: "devtmpfs", mnt.Fstype_BINFMT_MISC: "binfmt_misc",
	mnt.Fstype_TMPFS: "tmpfs", mnt.Fstype_DEVPTS: "devpts", mnt.Fstype_SIMFS: "simfs", mnt.Fstype_PSTORE: "pstore",
	mnt.Fstype_SECURITYFS: "securityfs", mnt.Fstype_FUSECTL: "fusectl", mnt.Fstype_DEBUGFS: "debugfs", mnt.Fstype_CGROUP: "cgroup",
	mnt.Fstype_AUFS: "aufs", mnt.Fstype_MQUEUE: "mqueue", mnt.Fstype_FUSE: "fuse", mnt.Fstype_OVERLAYFS: "overlay",
	mnt.Fstype_AUTOFS: "autofs", mnt.Fstype_TRACEFS: "tracefs", mnt.Fstype_CGROUP2: "cgroup2",
}

// Mounts reads the mount trees of the images in dir (one per mount
// namespace), every mount of each.
func Mounts(dir string) ([]Mount, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		err = eachEntry(b, magicMnts, maxMountEntry, func(e []byte) error {
			var m mnt.MntEntry
			if err := proto.Unmarshal(e, &m); err != nil {
				return err
			}
			t, ok := fsTypes[mnt.Fstype(m.GetFstype())]
			if !ok {
				t = m.GetFsname()
			}
			out = append(out, Mount{ID: m.GetMntId(), Parent: m.GetParentMntId(), Type: t, Point: m.GetMountpoint(),
				Root: m.GetRoot(), Source: m.GetSource(), External: m.GetExtMount() || m.GetExtKey() != "",
				ReadOnly: m.GetFlags()&msRdonly != 0})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
	}
	return out, nil
}

const msRdonly = 0x1

// EncodeMounts is a mount image, framed as CRIU writes one (tests and
// bench hostile: images that mount what the configuration does not).
func EncodeMounts(ms []Mount) ([]byte, error) {
	byName := map[string]mnt.Fstype{}
	for n, name := range fsTypes {
		byName[name] = n
	}
	buf := binary.LittleEndian.AppendUint32(nil, magicCommon)
	buf = binary.LittleEndian.AppendUint32(buf, magicMnts)
	for _, m := range ms {
		e := &mnt.MntEntry{MntId: proto.Uint32(m.ID), ParentMntId: proto.Uint32(m.Parent), RootDev: proto.Uint32(0),
			Root: proto.String(m.Root), Mountpoint: proto.String(m.Point), Source: proto.String(m.Source), Options: proto.String(""),
			Flags: proto.Uint32(0)}
		if n, ok := byName[m.Type]; ok {
			e.Fstype = proto.Uint32(uint32(n))
		} else {
			e.Fstype, e.Fsname = proto.Uint32(uint32(mnt.Fstype_AUTO)), proto.String(m.Type)
		}
		if m.ReadOnly {
			e.Flags = proto.Uint32(msRdonly)
		}
		if m.External {
			e.ExtKey = proto.String(m.Point)
		}
		b, err := proto.Marshal(e)
		if err != nil {
			return nil, err
		}
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(b)))
		buf = append(buf, b...)
	}
	return buf, nil
}
