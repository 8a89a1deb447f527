//go:build linux && amd64

package criu

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// RescueDirEnv names the directory where ferry's CRIU (patch 0015) keeps a
// record of each process its code is inside, for Rescue.
const RescueDirEnv = "CRIU_RESCUE_DIR"

// rescueRecord is what CRIU wrote before it changed a process: enough to
// put the process back if CRIU dies while its code runs inside it.
type rescueRecord struct {
	pid      int
	codeAddr uint64 // the start of the first executable mapping
	code     []byte // its bytes before CRIU wrote its system call there
	mapAddr  uint64 // the parasite's mapping, 0 before it was made
	mapLen   uint64
	sigmask  uint64
	regs     unix.PtraceRegs
}

// parseRescueRecord reads a record: "key value" lines, numbers in hex,
// byte strings (code, sigmask, regs: CRIU's structures as in memory) as
// hex.
func parseRescueRecord(b []byte) (rescueRecord, error) {
	var r rescueRecord
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<10)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return r, fmt.Errorf("rescue record: bad line %q", sc.Text())
		}
		var err error
		num := func(p *uint64) { *p, err = strconv.ParseUint(val, 16, 64) }
		var raw []byte
		switch key {
		case "pid":
			var v uint64
			num(&v)
			r.pid = int(v)
		case "code_addr":
			num(&r.codeAddr)
		case "map_addr":
			num(&r.mapAddr)
		case "map_len":
			num(&r.mapLen)
		case "native":
			if val != "1" {
				err = errors.New("not a 64-bit process")
			}
		case "code":
			r.code, err = hex.DecodeString(val)
		case "sigmask":
			if raw, err = hex.DecodeString(val); err == nil && len(raw) != 8 {
				err = errors.New("not 8 bytes")
			}
			if err == nil {
				r.sigmask = binary.LittleEndian.Uint64(raw)
			}
		case "regs":
			// CRIU's user_regs_struct_t: the native registers first.
			if raw, err = hex.DecodeString(val); err == nil && len(raw) < int(unsafe.Sizeof(r.regs)) {
				err = errors.New("too short")
			}
			if err == nil {
				err = binary.Read(bytes.NewReader(raw), binary.LittleEndian, &r.regs)
			}
		default:
			continue // a later CRIU's addition
		}
		if err != nil {
			return r, fmt.Errorf("rescue record: %s: %w", key, err)
		}
		seen[key] = true
	}
	for _, k := range []string{"pid", "code_addr", "code", "map_addr", "map_len", "native", "sigmask", "regs"} {
		if !seen[k] {
			return r, fmt.Errorf("rescue record: no %s", k)
		}
	}
	if len(r.code) < 8 {
		return r, errors.New("rescue record: code shorter than compel's")
	}
	return r, sc.Err()
}

// Rescue puts back every process recorded in dir (RescueDirEnv) whose
// CRIU died while its code was inside it: alive and no longer traced, the
// process spins at the end of a system call CRIU injected, or returned by
// itself from CRIU's parasite. It gets its code, registers and signal mask
// back and loses the parasite's mapping (when no thread runs there), and
// its record goes. Records of processes gone go too; those of processes
// still traced (their CRIU lives) or with a thread in the parasite (it is
// on its way back) are kept. rescued lists the processes put back.
func Rescue(dir string) (rescued []int, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	goruntime.LockOSThread() // ptrace requests come from the tracing thread
	defer goruntime.UnlockOSThread()
	var errs []error
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		pid, perr := strconv.Atoi(e.Name())
		if perr != nil {
			// A record half written (".PID.tmp") by a CRIU now dead.
			if t := strings.TrimSuffix(strings.TrimPrefix(e.Name(), "."), ".tmp"); t != e.Name() {
				if p, err := strconv.Atoi(t); err == nil && (!procs.Alive(p) || untraced(p)) {
					_ = os.Remove(path)
				}
			}
			continue
		}
		if !procs.Alive(pid) {
			_ = os.Remove(path)
			continue
		}
		if !ready(pid) {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r, err := parseRescueRecord(b)
		if err == nil && r.pid != pid {
			err = fmt.Errorf("rescue record %s is of %d", path, r.pid)
		}
		done := false
		if err == nil {
			done, err = putBack(r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rescue %d: %w", pid, err))
			continue
		}
		if done {
			_ = os.Remove(path)
			rescued = append(rescued, pid)
		}
	}
	return rescued, errors.Join(errs...)
}

// ready says whether recorded process pid can be put back now: its CRIU
// is gone (untraced), and it is not frozen. A frozen process takes no
// ptrace stop until it is thawed: it is put back then, by a later call.
// (One whose freezer cannot be read, the root's, is never frozen.)
func ready(pid int) bool {
	if !untraced(pid) {
		return false
	}
	frozen, err := cgroups.Frozen(pid)
	return err != nil || !frozen
}

// untraced says whether pid's tracer is gone (the kernel let it go).
func untraced(pid int) bool {
	v, ok, err := procs.Status(pid, "TracerPid")
	return err == nil && ok && v == "0"
}

// spinCode is compel's injected system call when records are kept:
// syscall; jmp . (then int3s, never reached).
var spinCode = []byte{0x0f, 0x05, 0xeb, 0xfe}

// parasiteMask is the signal mask compel gives a thread it runs code in:
// all blocked but SIGTRAP.
const parasiteMask = ^uint64(1 << (unix.SIGTRAP - 1))

// putBack seizes every thread of r's process and puts it back as r says.
// done is false when a thread runs in the parasite (the daemon returns by
// itself when it finds CRIU's socket closed: look again later).
func putBack(r rescueRecord) (done bool, err error) {
	pid := r.pid
	tids, err := seizeAll(pid)
	defer func() {
		for _, tid := range tids {
			_ = unix.PtraceDetach(tid)
		}
	}()
	if err != nil {
		return false, err
	}
	inMap := func(ip uint64) bool { return r.mapLen > 0 && ip >= r.mapAddr && ip < r.mapAddr+r.mapLen }
	var regs unix.PtraceRegs
	for _, tid := range tids {
		if err := unix.PtraceGetRegs(tid, &regs); err != nil {
			return false, err
		}
		if inMap(regs.Rip) {
			return false, nil
		}
	}
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return false, err
	}
	code := make([]byte, len(r.code))
	if _, err := unix.PtracePeekData(pid, uintptr(r.codeAddr), code); err != nil {
		return false, err
	}
	// Only CRIU's own bytes are written over: a PID reused since is left
	// alone (its record only goes).
	compels := bytes.HasPrefix(code, spinCode[:2]) && (code[2] == spinCode[2] || code[2] == 0xcc) // syscall; jmp . or int3
	if !bytes.Equal(code[:8], r.code[:8]) && !compels ||
		!bytes.Equal(code[8:], r.code[8:]) && !bytes.HasPrefix(code[8:], []byte("CRIUMFD\x00")) {
		return true, nil
	}
	// Spinning at compel's jmp, or set to run its system call: the
	// registers are CRIU's, the ones to put back are the record's. Else
	// the process runs its own code (CRIU died before or after its change
	// of the registers).
	back := regs
	if regs.Rip == r.codeAddr || regs.Rip == r.codeAddr+2 {
		back = r.regs
	}
	if parasiteMapped(pid, r) {
		if err := unmapParasite(pid, r, code); err != nil {
			return false, err
		}
	}
	if _, err := unix.PtracePokeData(pid, uintptr(r.codeAddr), r.code); err != nil {
		return false, err
	}
	if err := unix.PtraceSetRegs(pid, &back); err != nil {
		return false, err
	}
	// compel's mask goes; a mask the process set itself stays.
	var mask uint64
	if err := sigmask(unix.PTRACE_GETSIGMASK, pid, &mask); err != nil {
		return false, err
	}
	if mask == parasiteMask {
		if err := sigmask(unix.PTRACE_SETSIGMASK, pid, &r.sigmask); err != nil {
			return false, err
		}
	}
	return true, nil
}

// seizeAll seizes and stops every thread of pid (PTRACE_SEIZE and
// PTRACE_INTERRUPT: the process sees no signal), returning those held.
func seizeAll(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var held []int
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := unix.PtraceSeize(tid); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue // exited meanwhile
			}
			return held, err
		}
		held = append(held, tid)
		if err := unix.PtraceInterrupt(tid); err != nil {
			return held, err
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
			return held, err
		}
	}
	return held, nil
}

// parasiteMapped says whether r's parasite mapping is still there, whole,
// as compel made it (a memfd named CRIUMFD, or shared /dev/zero).
func parasiteMapped(pid int, r rescueRecord) bool {
	if r.mapLen == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return false
	}
	end := r.mapAddr
	for _, m := range procs.ParseMaps(b) {
		if m.Start == end && m.End <= r.mapAddr+r.mapLen && !m.Private() &&
			(strings.Contains(m.Path, "CRIUMFD") || strings.HasPrefix(m.Path, "/dev/zero")) {
			end = m.End
		}
	}
	return end == r.mapAddr+r.mapLen
}

// unmapParasite has pid (stopped, no thread in the parasite) unmap the
// parasite, the way compel runs a system call: syscall; jmp . at r's
// code address. Left there by our own death, pid spins where the record
// says, for the next Rescue. It ends back in an interrupt stop, so the
// registers put back next restart an interrupted system call as the
// kernel does.
func unmapParasite(pid int, r rescueRecord, code []byte) error {
	if err := unix.PtraceSetOptions(pid, unix.PTRACE_O_TRACESYSGOOD); err != nil {
		return err
	}
	if !bytes.Equal(code[:4], spinCode) {
		if _, err := unix.PtracePokeData(pid, uintptr(r.codeAddr), spinCode); err != nil {
			return err
		}
	}
	regs := r.regs
	regs.Rip, regs.Orig_rax = r.codeAddr, ^uint64(0)
	regs.Rax, regs.Rdi, regs.Rsi = unix.SYS_MUNMAP, r.mapAddr, r.mapLen
	if err := unix.PtraceSetRegs(pid, &regs); err != nil {
		return err
	}
	var ws unix.WaitStatus
	for _, stop := range []string{"entry", "exit"} {
		if err := unix.PtraceSyscall(pid, 0); err != nil {
			return err
		}
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return err
		}
		if !ws.Stopped() || ws.StopSignal() != unix.SIGTRAP|0x80 {
			return fmt.Errorf("munmap's %s: stopped by %v", stop, ws)
		}
	}
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return err
	}
	if regs.Rax != 0 {
		return fmt.Errorf("munmap of the parasite: %w", unix.Errno(-int64(regs.Rax)))
	}
	// Now at the jmp: let it spin, and stop it there.
	if err := unix.PtraceCont(pid, 0); err != nil {
		return err
	}
	if err := unix.PtraceInterrupt(pid); err != nil {
		return err
	}
	_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
	return err
}

func sigmask(req int, tid int, mask *uint64) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), 8, uintptr(unsafe.Pointer(mask)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// RescueWithin calls Rescue until no process it could put back is left
// recorded in dir, for up to wait: a thread still in the parasite when
// its CRIU died returns by itself moments later. A missing dir (a CRIU
// without patch 0015 keeps none) is nothing to do.
func RescueWithin(dir string, wait time.Duration) (rescued []int, err error) {
	for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		r, err := Rescue(dir)
		rescued = append(rescued, r...)
		if errors.Is(err, fs.ErrNotExist) {
			return rescued, nil
		}
		if !rescuable(dir) || time.Now().After(deadline) {
			return rescued, err
		}
	}
}

// rescuable says whether dir records a process Rescue could put back now
// or soon: alive, untraced, not frozen.
func rescuable(dir string) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && procs.Alive(pid) && ready(pid) {
			return true
		}
	}
	return false
}
