package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// Migrate asks the agent at control to migrate a container, calling
// progress for each live update, and returns the final report.
func Migrate(ctx context.Context, control string, req engine.Request, progress func(engine.Progress)) (engine.Report, error) {
	sess, err := transport.Dial(ctx, control, transport.Hello{Name: "cli", Role: "cli"})
	if err != nil {
		return engine.Report{}, err
	}
	defer sess.Close()
	ch, err := sess.Open(engine.ChanMigrate)
	if err != nil {
		return engine.Report{}, err
	}
	defer ch.Close()
	if err := ch.Send(req); err != nil {
		return engine.Report{}, err
	}
	for {
		var ev engine.Event
		if err := ch.Recv(&ev); err != nil {
			if transport.IsRemote(err) {
				return engine.Report{}, err
			}
			return engine.Report{}, fmt.Errorf("lost the source agent at %s during the migration of %q (%v): "+
				"the container may be at either host; check with `ferry lab status` or `runc list` on both", control, req.Container, err)
		}
		switch {
		case ev.Report != nil:
			return *ev.Report, nil
		case ev.Progress != nil && progress != nil:
			progress(*ev.Progress)
		}
		if ctx.Err() != nil {
			return engine.Report{}, errors.Join(ctx.Err(), errors.New("the agent carries on with the migration"))
		}
	}
}

// Status asks the agent at control what it runs.
func Status(ctx context.Context, control string) (engine.Status, error) {
	var st engine.Status
	sess, err := transport.Dial(ctx, control, transport.Hello{Name: "cli", Role: "cli"})
	if err != nil {
		return st, err
	}
	defer sess.Close()
	ch, err := sess.Open(engine.ChanStatus)
	if err != nil {
		return st, err
	}
	defer ch.Close()
	err = ch.Recv(&st)
	return st, err
}
