package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// The CLI's side of an agent's control socket.

// Migrate asks the agent at control to migrate a container, calling
// progress for each live update, and returns the final report.
func Migrate(ctx context.Context, control string, req engine.Request, progress func(engine.Progress)) (engine.Report, error) {
	return MigrateJob(ctx, control, req, nil, progress)
}

// MigrateJob is Migrate that also hears the migration's ID as soon as the
// agent accepts it (accepted), e.g. to cancel it or to leave it running.
func MigrateJob(ctx context.Context, control string, req engine.Request, accepted func(id string), progress func(engine.Progress)) (engine.Report, error) {
	req.ID = ""
	return follow(ctx, control, engine.ChanMigrate, req, accepted, progress, func(err error) error {
		return fmt.Errorf("lost the source agent at %s during the migration of %q (%v): "+
			"the container may be at either host; check with `ferry lab status` or `runc list` on both", control, req.Container, err)
	})
}

// Wait follows the migration id on the agent at control until it ends,
// and returns its report (at once if it has ended).
func Wait(ctx context.Context, control, id string, progress func(engine.Progress)) (engine.Report, error) {
	return follow(ctx, control, engine.ChanWait, engine.JobRef{ID: id}, nil, progress, func(err error) error {
		return fmt.Errorf("lost the agent at %s while waiting for migration %s: %w", control, id, err)
	})
}

// follow sends q on a channel of kind and reads events until the report.
func follow(ctx context.Context, control, kind string, q any, accepted func(string), progress func(engine.Progress), lost func(error) error) (engine.Report, error) {
	sess, err := transport.Dial(ctx, control, transport.Hello{Name: "cli", Role: "cli"})
	if err != nil {
		return engine.Report{}, err
	}
	defer sess.Close()
	ch, err := sess.Open(kind)
	if err != nil {
		return engine.Report{}, err
	}
	defer ch.Close()
	if err := ch.Send(q); err != nil {
		return engine.Report{}, err
	}
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	for {
		var ev engine.Event
		if err := ch.Recv(&ev); err != nil {
			if ctx.Err() != nil {
				return engine.Report{}, errors.Join(ctx.Err(), errors.New("the agent carries on with the migration"))
			}
			if transport.IsRemote(err) {
				return engine.Report{}, err
			}
			return engine.Report{}, lost(err)
		}
		switch {
		case ev.Report != nil:
			return *ev.Report, nil
		case ev.Job != nil && accepted != nil:
			accepted(ev.Job.ID)
		case ev.Progress != nil && progress != nil:
			progress(*ev.Progress)
		}
	}
}

// Status asks the agent at control what it runs.
func Status(ctx context.Context, control string) (engine.Status, error) {
	var st engine.Status
	err := ask(ctx, control, engine.ChanStatus, nil, &st)
	return st, err
}

// Jobs lists the agent's running migrations, and with all the ended ones
// it kept.
func Jobs(ctx context.Context, control string, all bool) ([]engine.Job, error) {
	var js []engine.Job
	err := ask(ctx, control, engine.ChanJobs, engine.JobsQuery{All: all}, &js)
	return js, err
}

// Cancel asks the agent to abort migration id where its source can still
// resume.
func Cancel(ctx context.Context, control, id string) (engine.CancelReply, error) {
	var r engine.CancelReply
	err := ask(ctx, control, engine.ChanCancel, engine.JobRef{ID: id}, &r)
	return r, err
}

// ask sends q (nil: nothing) on a channel of kind and reads one reply.
func ask(ctx context.Context, control, kind string, q, reply any) error {
	sess, err := transport.Dial(ctx, control, transport.Hello{Name: "cli", Role: "cli"})
	if err != nil {
		return err
	}
	defer sess.Close()
	ch, err := sess.Open(kind)
	if err != nil {
		return err
	}
	defer ch.Close()
	if q != nil {
		if err := ch.Send(q); err != nil {
			return err
		}
	}
	return ch.Recv(reply)
}
