// Package client asks a ferry agent for migrations and follows them, over
// the agent's control socket or, with an operator's certificate, its
// address: the client side of the api package's types.
package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// Endpoint is where the CLI reaches an agent: its control socket on this
// host, or, from anywhere, its peer address over mutual TLS with an
// operator's certificate.
type Endpoint struct {
	// Socket is the agent's control socket (--control); or
	Socket string
	// Addr is the agent's --listen address, and Name the host it must
	// prove to be ("" takes any host of the CA).
	Addr, Name string
	// Operator is the operator's certificate, for Addr (LoadOperator).
	Operator *Operator
}

// Operator is an operator's certificate and the CA's, which an agent
// asked over the network (Endpoint.Addr) requires.
type Operator = transport.Security

// LoadOperator reads operator name's certificate and key and the CA's
// certificate from dir (as `ferry certs operator` writes them): how a
// program away from an agent's host, a controller, reaches it.
func LoadOperator(dir, name string) (*Operator, error) { return transport.LoadOperator(dir, name) }

// Socket is the endpoint of an agent's control socket on this host.
func Socket(path string) Endpoint { return Endpoint{Socket: path} }

// String names the agent for messages.
func (e Endpoint) String() string {
	switch {
	case e.Socket != "":
		return e.Socket
	case e.Name != "":
		return e.Name + "@" + e.Addr
	}
	return e.Addr
}

func (e Endpoint) dial(ctx context.Context) (*transport.Session, error) {
	c := transport.DefaultConfig()
	if e.Socket != "" {
		c.Hello = transport.Hello{Name: "cli", Role: "cli"}
		return transport.Dial(ctx, e.Socket, c)
	}
	if e.Operator == nil {
		return nil, fmt.Errorf("agent at %s: an operator's certificate is needed to reach it over the network", e)
	}
	// One plain TCP connection (no MPTCP, no stripes): an operator's
	// requests are small.
	c.Hello, c.Security = transport.Hello{Role: "cli"}, e.Operator
	return transport.Dial(ctx, e.String(), c)
}

// Migrate asks the agent at ep to migrate a container, calling
// progress for each live update, and returns the final report.
func Migrate(ctx context.Context, ep Endpoint, req api.Request, progress func(api.Progress)) (api.Report, error) {
	return MigrateJob(ctx, ep, req, nil, progress)
}

// MigrateJob is Migrate that also hears the migration's ID as soon as the
// agent accepts it (accepted), e.g. to cancel it or to leave it running.
func MigrateJob(ctx context.Context, ep Endpoint, req api.Request, accepted func(id string), progress func(api.Progress)) (api.Report, error) {
	return follow(ctx, ep, api.ChanMigrate, req, accepted, progress, func(err error) error {
		return fmt.Errorf("lost the source agent at %s during the migration of %q (%v): "+
			"the container may be at either host; `ferry ps --all` on the source says what became of it once its agent is back", ep, req.Container, err)
	})
}

// Wait follows the migration id on the agent at ep until it ends,
// and returns its report (at once if it has ended).
func Wait(ctx context.Context, ep Endpoint, id string, progress func(api.Progress)) (api.Report, error) {
	return follow(ctx, ep, api.ChanWait, api.JobRef{ID: id}, nil, progress, func(err error) error {
		return fmt.Errorf("lost the agent at %s while waiting for migration %s: %w", ep, id, err)
	})
}

// follow sends q on a channel of kind and reads events until the report.
func follow(ctx context.Context, ep Endpoint, kind string, q any, accepted func(string), progress func(api.Progress), lost func(error) error) (api.Report, error) {
	sess, err := ep.dial(ctx)
	if err != nil {
		return api.Report{}, err
	}
	defer sess.Close()
	ch, err := sess.Open(kind)
	if err != nil {
		return api.Report{}, err
	}
	defer ch.Close()
	if err := ch.Send(q); err != nil {
		return api.Report{}, err
	}
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	for {
		var ev api.Event
		if err := ch.Recv(&ev); err != nil {
			if ctx.Err() != nil {
				return api.Report{}, errors.Join(ctx.Err(), errors.New("the agent carries on with the migration"))
			}
			if transport.IsRemote(err) {
				return api.Report{}, err
			}
			return api.Report{}, lost(err)
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

// Status asks the agent at ep what it runs.
func Status(ctx context.Context, ep Endpoint) (api.Status, error) {
	var st api.Status
	err := ask(ctx, ep, api.ChanStatus, nil, &st)
	return st, err
}

// Jobs lists the agent's running migrations, and with all the ended ones
// it kept.
func Jobs(ctx context.Context, ep Endpoint, all bool) ([]api.Job, error) {
	var js []api.Job
	err := ask(ctx, ep, api.ChanJobs, api.JobsQuery{All: all}, &js)
	return js, err
}

// Cancel asks the agent to abort migration id where its source can still
// resume.
func Cancel(ctx context.Context, ep Endpoint, id string) (api.CancelReply, error) {
	var r api.CancelReply
	err := ask(ctx, ep, api.ChanCancel, api.JobRef{ID: id}, &r)
	return r, err
}

// Resolve asks the agent to settle migration id, left in doubt, now.
func Resolve(ctx context.Context, ep Endpoint, id string) (api.Resolution, error) {
	var r api.Resolution
	err := ask(ctx, ep, api.ChanResolve, api.JobRef{ID: id}, &r)
	return r, err
}

// ask sends q (nil: nothing) on a channel of kind and reads one reply.
func ask(ctx context.Context, ep Endpoint, kind string, q, reply any) error {
	sess, err := ep.dial(ctx)
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

// Assess asks the agent at ep, which runs the container, how far its
// clients are and what a move to each candidate would take.
func Assess(ctx context.Context, ep Endpoint, q api.AssessQuery) (api.Assessment, error) {
	var a api.Assessment
	err := ask(ctx, ep, api.ChanAssess, q, &a)
	return a, err
}

// Reserve asks the agent at ep to hold room for a migration on its way,
// or to give it back (r.Release).
func Reserve(ctx context.Context, ep Endpoint, r api.Reservation) (api.ReserveReply, error) {
	var reply api.ReserveReply
	err := ask(ctx, ep, api.ChanReserve, r, &reply)
	return reply, err
}
