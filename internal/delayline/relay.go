// Package delayline adds a round-trip time to an emulated link in user
// space, for kernels without netem: a relay joins two interfaces of one
// network namespace (each the end of a veth pair) and holds every frame
// that crosses between them until its time has come, half the round trip
// in each direction, in order. The delay can change while traffic flows.
//
// The relay reads and writes with packet sockets that carry a virtio-net
// header (PACKET_VNET_HDR): a TCP sender's segmentation-offload frames of
// up to 64 KiB cross whole, with their checksum left to whoever
// segments them, instead of as forty 1500-byte frames. That is what lets
// two cores carry 1 Gbit/s through it. Bandwidth is left to tbf on the
// interfaces (the relay writes through their queueing disciplines), so a
// shaped link drops what overflows its queue as before.
package delayline

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"golang.org/x/sys/unix"
)

const (
	// DefaultMaxFrames and DefaultMaxBytes bound each direction's queue:
	// enough for 100 ms one way at 1 Gbit/s (12.5 MB in flight) twice
	// over, in 64 KiB frames or in ACKs.
	DefaultMaxFrames = 65536
	DefaultMaxBytes  = 32 << 20
	// MaxRTT bounds the round trip a line accepts.
	MaxRTT = 10 * time.Second

	// vnetHdrLen is struct virtio_net_hdr, ahead of every frame.
	vnetHdrLen = 10
	// recvBufLen takes any frame a veth hands over, BIG TCP's included.
	recvBufLen = 256 << 10
	// socketBuf is each socket's receive and send buffer: the send side
	// must hold a tbf's whole queue, or writes would block and the tbf's
	// queue would spill into the line's (growing the delay instead of
	// dropping, as a router's full queue does).
	socketBuf = 32 << 20
	// pollEvery is how often a blocked receiver or sender looks whether
	// the relay is stopping.
	pollEvery = 100 * time.Millisecond
)

// Pair is one link the line cuts: two interfaces of the namespace, each
// frame that arrives on one leaving through the other.
type Pair struct {
	A, B string
}

// Config configures a relay.
type Config struct {
	Pairs []Pair
	// RTT is the round trip the line adds: half of it each way.
	RTT time.Duration
	// MaxFrames and MaxBytes bound each direction's queue (0: the
	// defaults); what arrives beyond them is dropped and counted.
	MaxFrames, MaxBytes int
	// NetNS is the path of the namespace the interfaces are in; empty:
	// this process's.
	NetNS string
}

// Relay is a running delay line.
type Relay struct {
	rtt   atomic.Int64 // nanoseconds
	dirs  []*direction
	fds   []int
	epoch time.Time // the monotonic clock's zero for release times
	once  sync.Once
	// closed keeps Stats from asking the kernel about descriptor numbers
	// that may since name other files.
	closed atomic.Bool
}

// direction is frames from one interface to the other.
type direction struct {
	name     string
	from, to int
	q        *queue
	bufs     *buffers

	recvErrors atomic.Uint64 // frames the kernel could not hand over
	// socketDrops is what the kernel dropped at d.from's socket, its
	// receive buffer full (PACKET_STATISTICS, which resets as it is read).
	socketDrops atomic.Uint64
	truncated   atomic.Uint64 // frames larger than the receive buffer
	sendErrors  atomic.Uint64 // frames the interface refused (a full tbf: ENOBUFS; down)
}

// New opens the relay's sockets; Run moves the frames.
func New(c Config) (*Relay, error) {
	if len(c.Pairs) == 0 {
		return nil, errors.New("delay line: no interfaces to join")
	}
	if err := checkRTT(c.RTT); err != nil {
		return nil, err
	}
	if c.MaxFrames <= 0 {
		c.MaxFrames = DefaultMaxFrames
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	r := &Relay{epoch: time.Now()}
	r.rtt.Store(int64(c.RTT))
	err := inNetNS(c.NetNS, func() error {
		for _, p := range c.Pairs {
			a, err := r.open(p.A)
			if err != nil {
				return err
			}
			b, err := r.open(p.B)
			if err != nil {
				return err
			}
			r.dirs = append(r.dirs,
				&direction{name: p.A + " to " + p.B, from: a, to: b, q: newQueue(c.MaxFrames, c.MaxBytes), bufs: newBuffers()},
				&direction{name: p.B + " to " + p.A, from: b, to: a, q: newQueue(c.MaxFrames, c.MaxBytes), bufs: newBuffers()})
		}
		return nil
	})
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func checkRTT(d time.Duration) error {
	if d < 0 || d > MaxRTT {
		return fmt.Errorf("delay line: round trip %v out of range (0 to %v)", d, MaxRTT)
	}
	return nil
}

// open makes a packet socket bound to interface name, keeping it for Close.
func (r *Relay) open(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return -1, fmt.Errorf("delay line: %w", err)
	}
	// Protocol 0 receives nothing until bind names the interface, so no
	// other interface's frame slips in first.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("delay line: packet socket: %w", err)
	}
	r.fds = append(r.fds, fd)
	opts := []struct {
		level, opt, val int
		what            string
	}{
		{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1, "PACKET_VNET_HDR"},
		// What this socket sends must not come back to it as received.
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuf, "SO_RCVBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuf, "SO_SNDBUFFORCE"},
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil {
			return -1, fmt.Errorf("delay line: %s: %s: %w", name, o.what, err)
		}
	}
	tv := unix.NsecToTimeval(int64(pollEvery))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return -1, fmt.Errorf("delay line: %s: SO_RCVTIMEO: %w", name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		return -1, fmt.Errorf("delay line: bind to %s: %w", name, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// RTT is the round trip the line adds now.
func (r *Relay) RTT() time.Duration { return time.Duration(r.rtt.Load()) }

// SetRTT changes the round trip for frames that arrive from now on; those
// in flight keep their times, and none overtakes another.
func (r *Relay) SetRTT(d time.Duration) error {
	if err := checkRTT(d); err != nil {
		return err
	}
	r.rtt.Store(int64(d))
	return nil
}

// now is the monotonic clock in nanoseconds since the relay began.
func (r *Relay) now() int64 { return int64(time.Since(r.epoch)) }

// Run moves frames until ctx ends or a socket fails, then closes the
// sockets.
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2*len(r.dirs))
	var wg sync.WaitGroup
	for _, d := range r.dirs {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- r.receive(ctx, d) }()
		go func() { defer wg.Done(); errs <- r.send(ctx, d) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		cancel()
	}
	wg.Wait()
	r.Close()
	return err
}

// Close closes the sockets; Run does it when it ends.
func (r *Relay) Close() {
	r.once.Do(func() {
		r.closed.Store(true)
		for _, fd := range r.fds {
			unix.Close(fd)
		}
	})
}

// receive queues what arrives on d.from, each frame stamped as it comes.
func (r *Relay) receive(ctx context.Context, d *direction) error {
	buf := make([]byte, recvBufLen)
	for ctx.Err() == nil {
		// MSG_TRUNC: the frame's real length, to notice one cut short.
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, uintptr(d.from), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_TRUNC, 0, 0)
		switch errno {
		case 0:
		case unix.EAGAIN, unix.EINTR:
			continue
		case unix.ENETDOWN, unix.EINVAL, unix.ENOBUFS, unix.EMSGSIZE:
			// A link taken down, or a frame whose offload the header
			// cannot describe: that frame is lost, the line goes on.
			d.recvErrors.Add(1)
			continue
		default:
			return fmt.Errorf("delay line %s: receive: %w", d.name, errno)
		}
		if int(n) > len(buf) {
			d.truncated.Add(1)
			continue
		}
		if n < vnetHdrLen {
			continue
		}
		now := r.now()
		f := d.bufs.get(int(n))
		copy(f, buf[:n])
		if !d.q.push(f, now, r.rtt.Load()/2) {
			d.bufs.put(f)
		}
	}
	return nil
}

// send writes d's frames to d.to, each at its release time. It sleeps on
// a thread of its own with a timer slack of a microsecond: Go's timers
// would wake it up to a millisecond late, four times in a round trip.
func (r *Relay) send(ctx context.Context, d *direction) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
	for {
		f, ok := d.q.peek()
		if !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-d.q.ready:
			case <-time.After(pollEvery):
			}
			continue
		}
		if wait := f.release - r.now(); wait > 0 {
			if ctx.Err() != nil {
				return nil
			}
			ts := unix.NsecToTimespec(min(wait, int64(pollEvery)))
			_ = unix.Nanosleep(&ts, nil)
			continue
		}
		f = d.q.pop()
		_, _, errno := unix.Syscall(unix.SYS_WRITE, uintptr(d.to), uintptr(unsafe.Pointer(&f.data[0])), uintptr(len(f.data)))
		d.bufs.put(f.data)
		switch errno {
		case 0:
		case unix.ENOBUFS, unix.ENETDOWN, unix.ENXIO, unix.EMSGSIZE, unix.EINVAL, unix.EAGAIN, unix.EINTR:
			d.sendErrors.Add(1)
		default:
			return fmt.Errorf("delay line %s: send: %w", d.name, errno)
		}
	}
}

// DirectionStats is one direction's counts.
type DirectionStats struct {
	Name         string `json:"name"` // "from to to"
	Passed       uint64 `json:"passed"`
	PassedBytes  uint64 `json:"passed_bytes"`
	Dropped      uint64 `json:"dropped"` // the queue full
	DroppedBytes uint64 `json:"dropped_bytes"`
	Queued       int    `json:"queued"`
	QueuedBytes  int    `json:"queued_bytes"`
	RecvErrors   uint64 `json:"recv_errors,omitempty"`
	Truncated    uint64 `json:"truncated,omitempty"`
	SendErrors   uint64 `json:"send_errors,omitempty"`  // the interface refused: a full tbf, a link down
	SocketDrops  uint64 `json:"socket_drops,omitempty"` // the kernel's, the receive buffer full
}

// Stats is the line's state.
type Stats struct {
	RTT        time.Duration    `json:"rtt_ns"`
	Directions []DirectionStats `json:"directions"`
}

// Stats counts what the line passed and dropped so far.
func (r *Relay) Stats() Stats {
	s := Stats{RTT: r.RTT()}
	for _, d := range r.dirs {
		if !r.closed.Load() {
			if ps, err := unix.GetsockoptTpacketStats(d.from, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
				d.socketDrops.Add(uint64(ps.Drops))
			}
		}
		frames, bytes := d.q.depth()
		s.Directions = append(s.Directions, DirectionStats{
			Name: d.name, Passed: d.q.passed.Load(), PassedBytes: d.q.passedBytes.Load(),
			Dropped: d.q.dropped.Load(), DroppedBytes: d.q.droppedBytes.Load(),
			Queued: frames, QueuedBytes: bytes,
			RecvErrors: d.recvErrors.Load(), Truncated: d.truncated.Load(), SendErrors: d.sendErrors.Load(),
			SocketDrops: d.socketDrops.Load(),
		})
	}
	return s
}

// inNetNS runs fn in the namespace at path (the sockets it makes stay
// there), or right here when path is empty.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return cnet.Do(path, fn)
}
