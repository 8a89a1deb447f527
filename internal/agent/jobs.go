package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/google/renameio/v2"
)

// jobs are the migrations this agent runs as a source, by ID: running ones
// in memory (with what cancels them), ended ones also as a file each under
// dir, so that `ferry ps --all` and `ferry wait` find them after the CLI
// that started them is gone, and after a restart.
type jobs struct {
	dir string
	mu  sync.Mutex
	run map[string]*job
}

// job is one running migration.
type job struct {
	info   engine.Job
	cancel context.CancelFunc
	// gate decides between a cancel and the commit.
	gate *engine.CommitGate
	// ended is closed once info.Report is set.
	ended chan struct{}
	// watchers hear each progress update.
	watchers map[chan engine.Progress]struct{}
}

// keptJobs bounds the ended jobs kept on disk: the oldest go first.
const keptJobs = 200

// phasesPastCommit are those where cancelling can no longer resume the
// source: the destination owns the container, or may.
var phasesPastCommit = map[string]bool{"commit": true, "lazy-pages": true, "cleanup": true}

func newJobs(dir string) *jobs {
	return &jobs{dir: dir, run: map[string]*job{}}
}

// start registers a migration of req under req.ID (a new ID where the
// caller gave none) and returns it and the context it runs under
// (cancelled by cancel, or with parent). A caller's ID that names a job
// already, running or ended, starts nothing: that job is returned, with
// existing set.
func (js *jobs) start(parent context.Context, req engine.Request) (j *job, ctx context.Context, existing *engine.Job) {
	id := req.ID
	if id == "" {
		id = engine.NewID()
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	if other, ok := js.run[id]; ok {
		info := other.info
		return nil, nil, &info
	}
	if info := js.endedJob(id); info != nil {
		return nil, nil, info
	}
	ctx, cancel := context.WithCancel(parent)
	gate := engine.NewCommitGate(cancel)
	ctx = engine.WithCommitGate(ctx, gate)
	j = &job{
		info:     engine.Job{ID: id, Container: req.Container, To: req.To, Mode: req.Mode, Started: time.Now()},
		cancel:   cancel,
		gate:     gate,
		ended:    make(chan struct{}),
		watchers: map[chan engine.Progress]struct{}{},
	}
	js.run[id] = j
	return j, ctx, nil
}

// progress records an update and passes it to the job's watchers.
func (js *jobs) progress(j *job, p engine.Progress) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j.info.Progress = p
	for w := range j.watchers {
		select {
		case w <- p:
		default: // a slow watcher misses an update, never the report
		}
	}
}

// end records the report, keeps it on disk, and forgets the running job.
func (js *jobs) end(j *job, rep engine.Report) error {
	js.mu.Lock()
	j.info.Ended, j.info.Report = time.Now(), &rep
	delete(js.run, j.info.ID)
	info := j.info
	js.mu.Unlock()
	j.cancel()
	close(j.ended)
	return js.keep(info)
}

// keep writes an ended job to dir, dropping the oldest beyond keptJobs.
func (js *jobs) keep(info engine.Job) error {
	if err := os.MkdirAll(js.dir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	if err := renameio.WriteFile(filepath.Join(js.dir, info.ID+".json"), b, 0o600); err != nil {
		return err
	}
	ended, _ := js.readEnded()
	for i := 0; i < len(ended)-keptJobs; i++ {
		_ = os.Remove(filepath.Join(js.dir, ended[i].ID+".json"))
	}
	return nil
}

// readEnded lists the ended jobs on disk, oldest first.
func (js *jobs) readEnded() ([]engine.Job, error) {
	ents, err := os.ReadDir(js.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []engine.Job
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !engine.ValidID(id) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(js.dir, e.Name()))
		if err != nil {
			continue
		}
		var info engine.Job
		if json.Unmarshal(b, &info) == nil && info.ID == id {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Started.Before(out[k].Started) })
	return out, nil
}

// list returns the running jobs, and with all the ended ones kept too,
// oldest first.
func (js *jobs) list(all bool) ([]engine.Job, error) {
	var out []engine.Job
	if all {
		ended, err := js.readEnded()
		if err != nil {
			return nil, err
		}
		out = ended
	}
	js.mu.Lock()
	running := make([]engine.Job, 0, len(js.run))
	for _, j := range js.run {
		running = append(running, j.info)
	}
	js.mu.Unlock()
	sort.Slice(running, func(i, k int) bool { return running[i].Started.Before(running[k].Started) })
	return append(out, running...), nil
}

// running counts the jobs under way.
func (js *jobs) running() int {
	js.mu.Lock()
	defer js.mu.Unlock()
	return len(js.run)
}

// lazyPagesPending sums what the running post-copies have not yet
// delivered.
func (js *jobs) lazyPagesPending() int64 {
	js.mu.Lock()
	defer js.mu.Unlock()
	var n int64
	for _, j := range js.run {
		n += j.info.Progress.LazyPagesPending
	}
	return n
}

// cancelJob aborts a running job where the source can still resume.
func (js *jobs) cancelJob(id string) (engine.CancelReply, error) {
	js.mu.Lock()
	j, ok := js.run[id]
	var phase string
	if ok {
		phase = j.info.Progress.Phase
	}
	js.mu.Unlock()
	if !ok {
		if js.endedJob(id) != nil {
			return engine.CancelReply{Reason: "it has already ended (ferry wait " + id + " shows its report)"}, nil
		}
		return engine.CancelReply{}, fmt.Errorf("no migration %s here", id)
	}
	if phasesPastCommit[phase] {
		return engine.CancelReply{Reason: fmt.Sprintf("it is in its %s phase: the destination owns the container, or may, so the source cannot resume it; it runs to its end", phase)}, nil
	}
	if !j.gate.Cancel() {
		return engine.CancelReply{Reason: "it has sent its commit: the destination owns the container, or may, so the source cannot resume it; it runs to its end"}, nil
	}
	return engine.CancelReply{Cancelled: true}, nil
}

// endedJob reads an ended job from disk; nil if there is none.
func (js *jobs) endedJob(id string) *engine.Job {
	if !engine.ValidID(id) {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(js.dir, id+".json"))
	if err != nil {
		return nil
	}
	var info engine.Job
	if json.Unmarshal(b, &info) != nil {
		return nil
	}
	return &info
}

// wait calls progress for each update of job id until it ends, and returns
// its report.
func (js *jobs) wait(ctx context.Context, id string, progress func(engine.Progress)) (engine.Report, error) {
	js.mu.Lock()
	j, ok := js.run[id]
	var w chan engine.Progress
	if ok {
		w = make(chan engine.Progress, 16)
		j.watchers[w] = struct{}{}
	}
	js.mu.Unlock()
	if !ok {
		if info := js.endedJob(id); info != nil && info.Report != nil {
			return *info.Report, nil
		}
		return engine.Report{}, fmt.Errorf("no migration %s here", id)
	}
	defer func() {
		js.mu.Lock()
		delete(j.watchers, w)
		js.mu.Unlock()
	}()
	for {
		select {
		case p := <-w:
			progress(p)
		case <-j.ended:
			return *j.info.Report, nil
		case <-ctx.Done():
			return engine.Report{}, ctx.Err()
		}
	}
}

// settle records in an ended job's report how the migration it left in
// doubt ended: the source copy's final state (journal's terms) and a note.
// A migration the destination committed ran there: the report says ok.
// One whose agent died under it has no job kept: e makes one.
func (js *jobs) settle(e journal.Entry, note string) error {
	info := js.endedJob(e.ID)
	if info == nil {
		info = &engine.Job{ID: e.ID, Container: e.Container, To: e.Peer, Started: e.Updated, Ended: e.Updated,
			Report: &engine.Report{Container: e.Container, Runtime: e.Runtime, Error: "the source agent stopped during the migration"}}
	}
	if info.Report == nil {
		info.Report = &engine.Report{Container: e.Container, Runtime: e.Runtime}
	}
	info.Report.SourceState, info.Report.Settled = e.State, note
	info.Report.OK = e.State == journal.Removed
	return js.keep(*info)
}

// known says whether id names a job here, running or ended.
func (js *jobs) known(id string) bool {
	js.mu.Lock()
	_, ok := js.run[id]
	js.mu.Unlock()
	return ok || js.endedJob(id) != nil
}
