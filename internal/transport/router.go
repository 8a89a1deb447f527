package transport

import (
	"context"
	"fmt"
	"sync"
)

// Router hands a session's incoming channels to whoever waits for their
// kind; channels nobody expects go to a default handler. Expect must be
// called before the peer can open the channel (e.g. before acknowledging the
// step that lets it proceed), so there is no race between open and wait.
type Router struct {
	mu      sync.Mutex
	waiting map[string]chan *Channel
}

// NewRouter makes an empty router.
func NewRouter() *Router { return &Router{waiting: map[string]chan *Channel{}} }

// Expect registers interest in the next channel of kind.
func (r *Router) Expect(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiting[kind]; !ok {
		r.waiting[kind] = make(chan *Channel, 1)
	}
}

// Wait returns the channel of kind once the peer opened it.
func (r *Router) Wait(ctx context.Context, sess *Session, kind string) (*Channel, error) {
	r.mu.Lock()
	c, ok := r.waiting[kind]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("transport: waiting for a %q channel nobody expected", kind)
	}
	select {
	case ch := <-c:
		r.mu.Lock()
		delete(r.waiting, kind)
		r.mu.Unlock()
		return ch, nil
	case <-sess.Done():
		return nil, fmt.Errorf("connection to %s lost while waiting for %s", sess.Peer.Name, kind)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Serve accepts channels until the session ends, delivering each to its
// waiter or, when none, to handle in a new goroutine.
func (r *Router) Serve(sess *Session, handle func(*Channel)) {
	for {
		ch, err := sess.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		c, ok := r.waiting[ch.Kind]
		r.mu.Unlock()
		if ok {
			select {
			case c <- ch:
				continue
			default:
			}
		}
		go handle(ch)
	}
}
