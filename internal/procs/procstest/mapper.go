package procstest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// MapperEnv, set to "1", makes a test binary's TestMain run PlayMapper.
const MapperEnv = "FERRY_TEST_MAPPER"

// PlayMapper maps 8 MiB of private memory, writes it, says "ready", then
// for each line: "dontdump" and "dodump" madvise the whole mapping, "map"
// maps one page more elsewhere; each is answered "ok" or the error.
func PlayMapper(in io.Reader, out io.Writer) {
	mem, err := unix.Mmap(-1, 0, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(out, "mmap:", err)
		return
	}
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "dontdump":
			err = unix.Madvise(mem, unix.MADV_DONTDUMP)
		case "dodump":
			err = unix.Madvise(mem, unix.MADV_DODUMP)
		case "map": // stays mapped: nothing unmaps it
			_, err = unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		default:
			err = fmt.Errorf("unknown request %q", sc.Text())
		}
		if err != nil {
			fmt.Fprintln(out, err)
			continue
		}
		fmt.Fprintln(out, "ok")
	}
}

// StartMapper runs the test binary as a mapper (its TestMain must call
// PlayMapper under MapperEnv) until the test ends; ask sends it a line
// and fails the test unless it answers "ok".
func StartMapper(t testing.TB) (pid int, ask func(line string)) {
	t.Helper()
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), MapperEnv+"=1")
	in, out := StartTalking(t, c)
	t.Cleanup(func() { in.Close(); _ = c.Process.Kill(); _ = c.Wait() })
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("the mapper said %q, not ready", out.Text())
	}
	return c.Process.Pid, func(line string) {
		t.Helper()
		fmt.Fprintln(in, line)
		if !out.Scan() || out.Text() != "ok" {
			t.Fatalf("the mapper answered %q to %q", out.Text(), line)
		}
	}
}

// StartTalking starts c with a pipe to its input and one from its
// output, read line by line.
func StartTalking(t testing.TB, c *exec.Cmd) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return in, bufio.NewScanner(out)
}
