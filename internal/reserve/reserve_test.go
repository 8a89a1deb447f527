package reserve

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
)

const gib = 1 << 30

// host has 3 GiB available and 2 of 4 cores idle.
func book(now *time.Time) *Book {
	return &Book{
		Free: func() (api.HostLoad, error) {
			return api.HostLoad{Cores: 4, BusyCores: 2, FreeMemory: 3 * gib, FreeStorage: 100 * gib}, nil
		},
		Now: func() time.Time { return *now },
	}
}

// Two sources ask one host with room for one: one yes, one no, whatever
// the order.
func TestTwoSourcesOneRoom(t *testing.T) {
	now := time.Now()
	b := book(&now)
	var wg sync.WaitGroup
	replies := make([]api.ReserveReply, 2)
	for i, id := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb"} {
		wg.Go(func() {
			r, err := b.Reserve(api.Reservation{ID: id, Container: "c" + id[:1], MemoryBytes: 2 * gib, Cores: 0.5})
			if err != nil {
				t.Error(err)
			}
			replies[i] = r
		})
	}
	wg.Wait()
	if replies[0].OK == replies[1].OK {
		t.Fatalf("both %v: %+v", replies[0].OK, replies)
	}
	for _, r := range replies {
		if !r.OK && !strings.Contains(r.Reason, "reserved") {
			t.Errorf("refusal %q does not say the room is reserved", r.Reason)
		}
	}
	// An offer without a reservation is held to what is left.
	if _, err := b.Take("cccccccccccc", 2*gib); err == nil || !strings.Contains(err.Error(), "reserved for migrations on their way") {
		t.Errorf("unreserved offer: %v", err)
	}
	if release, err := b.Take("dddddddddddd", gib/2); err != nil {
		t.Errorf("a small unreserved offer: %v", err)
	} else {
		release()
	}
}

func TestCores(t *testing.T) {
	now := time.Now()
	b := book(&now)
	if r, _ := b.Reserve(api.Reservation{ID: "a", Container: "x", Cores: 1.5}); !r.OK {
		t.Fatal(r.Reason)
	}
	r, _ := b.Reserve(api.Reservation{ID: "b", Container: "y", Cores: 1})
	if r.OK || !strings.Contains(r.Reason, "cores") {
		t.Errorf("2 idle cores, 1.5 reserved, 1 more asked: %+v", r)
	}
}

func TestTakeHoldsUntilReleased(t *testing.T) {
	now := time.Now()
	b := book(&now)
	if r, _ := b.Reserve(api.Reservation{ID: "a", Container: "x", MemoryBytes: 2 * gib}); !r.OK {
		t.Fatal(r.Reason)
	}
	release, err := b.Take("a", 2*gib)
	if err != nil {
		t.Fatal(err)
	}
	// In use, it does not expire, and a release by a caller does not drop
	// it from under the migration.
	now = now.Add(time.Hour)
	if _, err := b.Reserve(api.Reservation{ID: "a", Container: "x", Release: true}); err != nil {
		t.Fatal(err)
	}
	if l, _ := b.Load(); l.ReservedMemory != 2*gib {
		t.Errorf("while the migration runs: %+v", l)
	}
	release()
	if l, _ := b.Load(); l.ReservedMemory != 0 || l.FreeMemory != 3*gib {
		t.Errorf("after it ended: %+v", l)
	}
}

func TestExpiryAndRenewal(t *testing.T) {
	now := time.Now()
	b := book(&now)
	if r, _ := b.Reserve(api.Reservation{ID: "a", Container: "x", MemoryBytes: gib, TTLSeconds: 10}); !r.OK {
		t.Fatal(r.Reason)
	}
	now = now.Add(8 * time.Second)
	if r, _ := b.Reserve(api.Reservation{ID: "a", Container: "x", MemoryBytes: gib, TTLSeconds: 10}); !r.OK || r.Load.ReservedMemory != gib {
		t.Fatalf("renewal counted twice or refused: %+v", r)
	}
	now = now.Add(8 * time.Second)
	if l, _ := b.Load(); l.ReservedMemory != gib {
		t.Errorf("renewed 8 s ago for 10 s, yet gone: %+v", l)
	}
	now = now.Add(3 * time.Second)
	if l, _ := b.Load(); l.ReservedMemory != 0 {
		t.Errorf("expired but held: %+v", l)
	}
	// Taken after expiry: an unreserved offer, checked against the room.
	if _, err := b.Take("a", gib); err != nil {
		t.Error(err)
	}
}

func TestBadReservations(t *testing.T) {
	now := time.Now()
	b := book(&now)
	for _, r := range []api.Reservation{
		{Container: "x"},
		{ID: "a", Container: "x", MemoryBytes: -1},
		{ID: "a", Container: "x", TTLSeconds: 3600},
	} {
		if _, err := b.Reserve(r); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	if r, _ := b.Reserve(api.Reservation{ID: "a", Container: "x"}); !r.OK {
		t.Fatal(r.Reason)
	}
	if _, err := b.Reserve(api.Reservation{ID: "a", Container: "y"}); err == nil || !strings.Contains(err.Error(), `held for "x"`) {
		t.Errorf("an ID held for another container: %v", err)
	}
}
