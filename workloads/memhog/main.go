// Command memhog is the lab's migration workload: it holds a buffer of
// pseudo-random data, keeps dirtying it at a set rate, and answers STAT and
// VERIFY over UDP so a client can tell whether it kept running and whether
// its memory survived a checkpoint/restore intact.
//
// It opens nothing but stdout and one UDP socket, so CRIU can move it to
// another network namespace.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "memhog:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("memhog", flag.ContinueOnError)
	memFlag := fs.String("memory", "64M", "buffer size: bytes or with K/M/G/T (KiB/MiB/... too; all binary)")
	rate := fs.Float64("dirty-rate", 0, "pages dirtied per second (0: none)")
	port := fs.Int("port", 7000, "UDP port to answer on, on all addresses")
	echoPort := fs.Int("echo-port", 0, "TCP port echoing each line back (0: none), for connection-keeping tests")
	seed := fs.Uint64("seed", 0, "seed of the buffer's contents (default: from the time)")
	journalPath := fs.String("journal", "", "file to write records into while running (a volume's, in the tests): VERIFY checks it too")
	journalRate := fs.String("journal-rate", "64K", "bytes per second written to --journal, in 4 KiB records")
	journalFill := fs.String("journal-fill", "0", "bytes of records written to --journal at the start, before it answers ready")
	watchPath := fs.String("watch", "", "file to write and keep an inotify watch on: VERIFY checks the watch still reports a write")
	words := fs.Uint64("dirty-words", 1, "8-byte words rewritten in each dirtied page (1..512; 512 rewrites the whole page)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	size, err := parseSize(*memFlag)
	if err != nil {
		return err
	}
	if *rate < 0 {
		return fmt.Errorf("--dirty-rate must not be negative")
	}
	seedSet := false
	fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "seed" })
	if !seedSet {
		*seed = uint64(time.Now().UnixNano())
	}

	// As PID 1 in a container SIGTERM would be ignored unless handled.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		os.Exit(0)
	}()

	if *words < 1 || *words > wordsPerPage {
		return fmt.Errorf("--dirty-words must be between 1 and %d", wordsPerPage)
	}
	mem, err := newMemory(size)
	if err != nil {
		return err
	}
	mem.dirtyWords = *words
	// math/rand's global source is seeded by the runtime from the kernel's
	// per-exec random bytes. crypto/rand is avoided: it may set up vDSO
	// getrandom state, one more mapping for CRIU to carry.
	h := &hog{mem: mem, boot: fmt.Sprintf("%016x", rand.Uint64())}

	// Listen before filling, so a client sees "not ready" rather than
	// silence while a large buffer fills.
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{Port: *port})
	if err != nil {
		return err
	}
	go h.tick()
	serveErr := make(chan error, 1)
	go func() { serveErr <- h.serve(conn) }()
	if *echoPort > 0 {
		// Go listens with MPTCP by default since 1.24; CRIU cannot dump an
		// MPTCP socket ("Unsupported proto 262"), so this one is plain TCP.
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(context.Background(), "tcp4", fmt.Sprintf(":%d", *echoPort))
		if err != nil {
			return err
		}
		go func() { serveErr <- serveEcho(l) }()
	}

	if *watchPath != "" {
		w, err := newWatch(*watchPath)
		if err != nil {
			return err
		}
		h.watch.Store(w)
	}

	// The journal's first records are written before the memory, which
	// says ready once filled.
	var journalBps float64
	if *journalPath != "" {
		jr, err := parseSize(*journalRate)
		if err != nil {
			return fmt.Errorf("--journal-rate: %w", err)
		}
		fill, err := parseSize(*journalFill)
		if err != nil {
			return fmt.Errorf("--journal-fill: %w", err)
		}
		j, err := openJournal(*journalPath, *seed)
		if err != nil {
			return err
		}
		if err := j.fill(fill); err != nil {
			return err
		}
		h.journal.Store(j)
		journalBps = float64(jr)
	}

	start := time.Now()
	mem.fill(*seed)
	fmt.Printf("memhog ready: %d bytes (%d pages) at %#x, filled in %v, seed %d, boot %s, udp port %d, dirty rate %g pages/s\n",
		len(mem.buf), mem.pages, mem.addr(), time.Since(start).Round(time.Millisecond), *seed, h.boot, *port, *rate)

	go h.dirtyLoop(*rate)
	if j := h.journal.Load(); j != nil {
		go j.writeLoop(journalBps)
	}
	return <-serveErr
}
