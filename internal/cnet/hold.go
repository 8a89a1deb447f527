package cnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A Hold keeps the packets that reach a container's network namespace
// queued in the kernel (netfilter's NFQUEUE, before any other rule) until
// it is released or dropped. The destination holds them from the moment
// the source froze until its copy runs: a peer's retransmission that
// arrives meanwhile is delivered at the commit, not lost, so the peer does
// not wait out a retransmission timer that doubled while nothing answered;
// and before the commit no packet reaches the restored sockets, so a copy
// that is dropped never acknowledged data the source's copy did not see.

// The kernel's nfnetlink_queue interface (linux/netfilter/nfnetlink_queue.h).
const (
	nfnlSubsysQueue  = 3
	nfqnlMsgPacket   = 0
	nfqnlMsgVerdictB = 3 // a verdict for every packet up to an ID
	nfqnlMsgConfig   = 2

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2

	nfqaCfgCmd         = 1
	nfqaCfgParams      = 2
	nfqaCfgQueueMaxlen = 3

	nfqnlCfgCmdBind = 1
	nfqnlCopyMeta   = 1 // packet IDs only, never their contents

	nfAccept = 1

	// holdQueue is the queue number; each namespace has its own queues.
	holdQueue = 0
	// holdMaxlen bounds the packets held; beyond it the kernel drops them
	// (the peer retransmits), never lets them through early.
	holdMaxlen = 4096
)

// holdRule is the iptables rule that queues every incoming IPv4 packet:
// raw PREROUTING comes before the filter rules CRIU locks the network with.
var holdRule = []string{"PREROUTING", "-j", "NFQUEUE", "--queue-num", "0"}

// holdRuleCmd adds (-I) or deletes (-D) the hold's rule.
func holdRuleCmd(op string) []string {
	return append([]string{"iptables", "-t", "raw", op}, holdRule...)
}

// Hold is a namespace's incoming packets held (see above).
type Hold struct {
	nsPath string
	sock   *nl.NetlinkSocket
	mu     sync.Mutex
	lastID uint32 // the last packet queued, 0 for none yet
	held   int
	// passing: released, so the reader accepts each packet as it comes
	// until Close takes the rule away.
	passing bool
	done    chan struct{}
	once    sync.Once
}

// HoldIncoming starts holding what reaches the namespace at nsPath.
func HoldIncoming(nsPath string) (*Hold, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	// A queue belongs to a namespace: the socket is made in it.
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netfilter queue socket: %w", err)
	}
	h := &Hold{nsPath: nsPath, sock: sock, done: make(chan struct{})}
	cmd := make([]byte, 4) // struct nfqnl_msg_config_cmd: command, pad, pf (be16)
	cmd[0] = nfqnlCfgCmdBind
	binary.BigEndian.PutUint16(cmd[2:], unix.AF_INET)
	params := make([]byte, 5) // struct nfqnl_msg_config_params: copy_range (be32), copy_mode
	params[4] = nfqnlCopyMeta
	maxlen := binary.BigEndian.AppendUint32(nil, holdMaxlen)
	if err := h.configure(nl.NewRtAttr(nfqaCfgCmd, cmd), nl.NewRtAttr(nfqaCfgParams, params), nl.NewRtAttr(nfqaCfgQueueMaxlen, maxlen)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("bind netfilter queue: %w", err)
	}
	go h.read()
	// Only once someone reads the queue: a queue without a reader drops.
	if _, err := inNS(nsPath, holdRuleCmd("-I")...); err != nil {
		h.close()
		return nil, fmt.Errorf("hold incoming packets: %w", err)
	}
	return h, nil
}

// configure sends a configuration message and waits for the kernel's
// answer (before the reader runs, so the answer is read here).
func (h *Hold) configure(attrs ...*nl.RtAttr) error {
	if err := h.sendFlags(nfqnlMsgConfig, unix.NLM_F_ACK, attrs...); err != nil {
		return err
	}
	_ = h.sock.SetReceiveTimeout(&unix.Timeval{Sec: 5})
	defer h.sock.SetReceiveTimeout(&unix.Timeval{})
	msgs, _, err := h.sock.Receive()
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				return syscall.Errno(errno)
			}
			return nil
		}
	}
	return errors.New("no answer from the kernel")
}

// send sends one nfnetlink_queue message for holdQueue.
func (h *Hold) send(msg int, attrs ...*nl.RtAttr) error {
	return h.sendFlags(msg, 0, attrs...)
}

func (h *Hold) sendFlags(msg, flags int, attrs ...*nl.RtAttr) error {
	req := nl.NewNetlinkRequest(nfnlSubsysQueue<<8|msg, flags)
	req.AddData(nfgenmsg{})
	for _, a := range attrs {
		req.AddData(a)
	}
	return h.sock.Send(req)
}

// nfgenmsg is nfnetlink's header: family, version, resource (the queue,
// be16), all zero here. It must come before the attributes.
type nfgenmsg struct{}

func (nfgenmsg) Len() int          { return 4 }
func (nfgenmsg) Serialize() []byte { return []byte{unix.AF_UNSPEC, 0, 0, holdQueue} }

// read notes each queued packet's ID until the socket closes.
func (h *Hold) read() {
	defer close(h.done)
	for {
		msgs, _, err := h.sock.Receive()
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			return // closed
		}
		queued, passing := false, false
		for _, m := range msgs {
			if id, ok := packetID(m); ok {
				h.mu.Lock()
				h.lastID, h.held, passing = id, h.held+1, h.passing
				h.mu.Unlock()
				queued = true
			}
		}
		if queued && passing {
			_ = h.accept()
		}
	}
}

// packetID is the ID of a queued packet's message.
func packetID(m syscall.NetlinkMessage) (uint32, bool) {
	if m.Header.Type != nfnlSubsysQueue<<8|nfqnlMsgPacket || len(m.Data) < 4 {
		return 0, false
	}
	attrs, err := nl.ParseRouteAttr(m.Data[4:]) // after struct nfgenmsg
	if err != nil {
		return 0, false
	}
	for _, a := range attrs {
		// struct nfqnl_msg_packet_hdr: packet_id (be32), hw_protocol, hook.
		if a.Attr.Type&^unix.NLA_F_NESTED == nfqaPacketHdr && len(a.Value) >= 4 {
			return binary.BigEndian.Uint32(a.Value), true
		}
	}
	return 0, false
}

// accept lets every packet queued so far go on its way.
func (h *Hold) accept() error {
	h.mu.Lock()
	id := h.lastID
	h.mu.Unlock()
	if id == 0 {
		return nil
	}
	hdr := binary.BigEndian.AppendUint32(nil, nfAccept) // struct nfqnl_msg_verdict_hdr
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	return h.send(nfqnlMsgVerdictB, nl.NewRtAttr(nfqaVerdictHdr, hdr))
}

// Release delivers what was held and from then on lets each packet
// through as it is queued; it returns how many were held. The rule stays
// until Close, which can wait until after the commit: removing it runs
// iptables, tens of milliseconds the peers need not wait for.
func (h *Hold) Release() (int, error) {
	h.mu.Lock()
	h.passing = true
	n := h.held
	h.mu.Unlock()
	return n, h.accept()
}

// Close stops holding after a Release: the rule goes, what was queued
// before it went is accepted, and the queue's reader stops.
func (h *Hold) Close() error {
	_, err := inNS(h.nsPath, holdRuleCmd("-D")...)
	if err != nil {
		err = fmt.Errorf("stop holding packets: %w", err)
	}
	// What was queued before the rule went: its IDs are read in a moment.
	time.Sleep(5 * time.Millisecond)
	err = errors.Join(err, h.accept())
	h.close()
	return err
}

// Drop discards what was held and stops holding: the peers retransmit to
// wherever the address is next.
func (h *Hold) Drop() {
	_, _ = inNS(h.nsPath, holdRuleCmd("-D")...)
	h.close() // the kernel drops a queue's packets when its reader goes
}

func (h *Hold) close() {
	h.once.Do(func() {
		h.sock.Close()
		<-h.done
	})
}

// EndHold removes a hold's rule that no reader serves any more (its agent
// died with it): a queue without a reader drops every packet, so the
// container would run unreachable. Nothing is done where no rule is.
func EndHold(nsPath string) error {
	check := append([]string{"iptables", "-t", "raw", "-C"}, holdRule...)
	if _, err := inNS(nsPath, check...); err != nil {
		return nil // no rule (or no iptables: then no hold was ever made)
	}
	if _, err := inNS(nsPath, holdRuleCmd("-D")...); err != nil {
		return fmt.Errorf("stop holding packets: %w", err)
	}
	return nil
}
