package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
)

// TestKeepsAddressAndConnections runs memhog with an address of its own on
// the lab's L2 segment and a client on h3 holding one TCP connection to it
// (a numbered line every 10 ms, each echoed back), migrates it from h1 to
// h2, and checks the address moved with it and the connection carried on:
// no reconnect, every line answered in order.
func TestKeepsAddressAndConnections(t *testing.T) {
	for _, mode := range []string{engine.ModeCold, engine.ModePostcopy} {
		t.Run(mode, func(t *testing.T) {
			requireLab(t)
			bin := ferryBin(t)
			l := upLab(t, bin)
			ctx := context.Background()
			const ip = "10.79.0.10"
			if err := l.RunOnSegment(ctx, "h1", "hog", ip, []string{"/bin/memhog", "--memory", "32M", "--dirty-rate", "100",
				"--port", memhogPort, "--echo-port", "7001"}); err != nil {
				t.Fatal(err)
			}
			p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin, []string{ip + ":" + memhogPort}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			stream := l.Hosts[2].Command(ctx, bin, "lab-tool", "stream", "--addr", ip+":7001")
			in, _ := stream.StdinPipe()
			out, _ := stream.StdoutPipe()
			stream.Stderr = os.Stderr
			if err := stream.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = stream.Process.Kill(); _ = stream.Wait() })
			rd := bufio.NewReader(out)
			if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "connected") {
				t.Fatalf("stream client: %q %v", line, err)
			}
			time.Sleep(300 * time.Millisecond)

			rep, err := agent.Migrate(ctx, l.Hosts[0].ControlSock, engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: mode}, nil)
			if err != nil || !rep.OK {
				t.Fatalf("migration: %v %s", err, rep.Error)
			}
			time.Sleep(500 * time.Millisecond)
			in.Close()
			var res struct {
				Sent, Received int
				MaxGapMs       float64 `json:"max_gap_ms"`
				OK             bool
				Error          string
			}
			line, err := rd.ReadString('\n')
			if err != nil || json.Unmarshal([]byte(line), &res) != nil {
				t.Fatalf("stream result %q: %v", line, err)
			}
			pr, perr := p.Stop()
			if !res.OK {
				t.Fatalf("the TCP connection did not survive: %+v", res)
			}
			if perr != nil || !pr.StateOK {
				t.Fatalf("workload state: %+v %v", pr, perr)
			}
			if _, err := os.Stat(cnet.Path(cnet.Name("h1", "hog"))); err == nil {
				t.Error("the source's network namespace is still there")
			}
			if _, err := os.Stat(cnet.Path(cnet.Name("h2", "hog"))); err != nil {
				t.Errorf("the destination has no network namespace for the container: %v", err)
			}
			t.Logf("%s: downtime %.0f ms; one TCP connection, %d lines echoed in order, longest wait %.0f ms; probe gap %.0f ms",
				mode, rep.DowntimeMs, res.Received, res.MaxGapMs, pr.ClientDowntimeMs)
		})
	}
}
