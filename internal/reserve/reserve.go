// Package reserve keeps the room a host has promised to migrations on
// their way: a reservation (memory, cores) made before the source is
// asked to migrate, taken by the incoming migration of its ID, and given
// back when that migration ends or, unused, when it expires. Two sources
// asking one host with room for one get one yes and one no, and an
// offer without a reservation is held to what the reservations leave.
package reserve

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/api"
)

// DefaultTTL is how long a reservation is held unused: long enough for
// the source to measure and connect, short enough that a follower that
// died does not block a host for long.
const DefaultTTL = 2 * time.Minute

// MaxTTL bounds what a caller may ask for.
const MaxTTL = 30 * time.Minute

// Book is one host's reservations. Free says what the host has now,
// before reservations (its memory available, idle cores, storage).
type Book struct {
	Free func() (api.HostLoad, error)
	// Now is the clock (nil: time.Now), for tests.
	Now func() time.Time

	mu   sync.Mutex
	held map[string]*hold
}

type hold struct {
	r       api.Reservation
	expires time.Time
	inUse   bool
}

func (b *Book) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// Load is the host's room after the reservations.
func (b *Book) Load() (api.HostLoad, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loadLocked("")
}

// loadLocked is the room left, not counting reservation except.
func (b *Book) loadLocked(except string) (api.HostLoad, error) {
	l, err := b.Free()
	if err != nil {
		return api.HostLoad{}, err
	}
	b.expireLocked()
	for id, h := range b.held {
		if id == except {
			continue
		}
		l.ReservedMemory += h.r.MemoryBytes
		l.ReservedCores += h.r.Cores
	}
	l.FreeMemory -= l.ReservedMemory
	return l, nil
}

func (b *Book) expireLocked() {
	now := b.now()
	for id, h := range b.held {
		if !h.inUse && now.After(h.expires) {
			delete(b.held, id)
		}
	}
}

// Reserve holds room for r, or releases it (r.Release). Asking again
// for the same ID and container renews it; an ID held for another
// container is refused.
func (b *Book) Reserve(r api.Reservation) (api.ReserveReply, error) {
	if r.ID == "" {
		return api.ReserveReply{}, fmt.Errorf("a reservation needs the ID its migration will have")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.Release {
		if h, ok := b.held[r.ID]; ok && !h.inUse {
			delete(b.held, r.ID)
		}
		l, err := b.loadLocked("")
		return api.ReserveReply{OK: true, Load: l}, err
	}
	if r.MemoryBytes < 0 || !(r.Cores >= 0) {
		return api.ReserveReply{}, fmt.Errorf("reservation %s: memory %d and cores %v must not be negative", r.ID, r.MemoryBytes, r.Cores)
	}
	ttl := time.Duration(r.TTLSeconds * float64(time.Second))
	switch {
	case ttl <= 0:
		ttl = DefaultTTL
	case ttl > MaxTTL:
		return api.ReserveReply{}, fmt.Errorf("reservation %s: %v is longer than %v", r.ID, ttl, MaxTTL)
	}
	if h, ok := b.held[r.ID]; ok && h.r.Container != r.Container {
		return api.ReserveReply{}, fmt.Errorf("reservation %s is held for %q, not %q", r.ID, h.r.Container, r.Container)
	}
	l, err := b.loadLocked(r.ID)
	if err != nil {
		return api.ReserveReply{}, err
	}
	var why []string
	if r.MemoryBytes > l.FreeMemory {
		why = append(why, fmt.Sprintf("needs %d bytes of memory, %d free after %d reserved", r.MemoryBytes, max(l.FreeMemory, 0), l.ReservedMemory))
	}
	if idle := l.Cores - l.BusyCores - l.ReservedCores; r.Cores > idle {
		why = append(why, fmt.Sprintf("needs %.2f cores, %.2f idle after %.2f reserved", r.Cores, max(idle, 0), l.ReservedCores))
	}
	if len(why) > 0 {
		return api.ReserveReply{Reason: strings.Join(why, "; "), Load: l}, nil
	}
	if b.held == nil {
		b.held = map[string]*hold{}
	}
	h := b.held[r.ID]
	if h == nil {
		h = &hold{}
		b.held[r.ID] = h
	}
	h.r, h.expires = r, b.now().Add(ttl)
	l.FreeMemory -= r.MemoryBytes
	l.ReservedMemory += r.MemoryBytes
	l.ReservedCores += r.Cores
	return api.ReserveReply{OK: true, Load: l}, nil
}

// Take claims room for the incoming migration id of memory bytes: its
// reservation if it has one (which then no longer expires), else memory
// the reservations leave free. release gives it back; call it when the
// migration ends, whatever became of it.
func (b *Book) Take(id string, memory int64) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	if h, ok := b.held[id]; ok && !h.inUse {
		h.inUse = true
		return func() { b.drop(id) }, nil
	}
	l, err := b.loadLocked("")
	if err != nil {
		// The room is unknown: admission's bounds still hold, and a host
		// that cannot read its own memory refuses nothing here.
		return func() {}, nil
	}
	if memory > l.FreeMemory && l.ReservedMemory > 0 {
		return nil, fmt.Errorf("%d bytes of memory are asked, %d free once the %d reserved for migrations on their way are held", memory, max(l.FreeMemory, 0), l.ReservedMemory)
	}
	return func() {}, nil
}

func (b *Book) drop(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.held, id)
}
