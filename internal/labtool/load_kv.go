package labtool

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// kvLoad is what the key-value clients (redis, memcached) keep of their
// requests: lane 0 writes w:<run>:<i>, the other lanes read back the
// newest acknowledged write; a read that finds another value, or none, is
// a broken promise.
type kvLoad struct {
	runName  string
	mu       sync.Mutex
	acked    []int // writes answered OK, by index
	newest   atomic.Int64
	reads    atomic.Int64
	badReads atomic.Int64
}

func (k *kvLoad) init(run string) {
	k.runName = run
	k.newest.Store(-1)
}

func writeKey(run string, i int) string { return fmt.Sprintf("w:%s:%d", run, i) }

// kvConn is one connection's commands: get says found false for an
// absent key, and only fails for an error that is not the key's absence.
type kvConn struct {
	set  func(key string, value []byte) error
	get  func(key string) (value []byte, found bool, err error)
	ping func() error
}

// exchange runs lane's i-th request on c: lane 0 writes key i, the other
// lanes read the newest key written (a ping before the first).
func (k *kvLoad) exchange(c kvConn, lane, i int) error {
	if lane == 0 {
		key := writeKey(k.runName, i)
		if err := c.set(key, value(key, loadValueSize)); err != nil {
			return err
		}
		k.mu.Lock()
		k.acked = append(k.acked, i)
		k.mu.Unlock()
		k.newest.Store(int64(i))
		return nil
	}
	j := k.newest.Load()
	if j < 0 {
		return c.ping()
	}
	key := writeKey(k.runName, int(j))
	got, found, err := c.get(key)
	if err != nil {
		return err
	}
	k.reads.Add(1)
	if !found || string(got) != string(value(key, loadValueSize)) {
		k.badReads.Add(1)
	}
	return nil
}

// ackedKeys lists the keys of the writes answered OK.
func (k *kvLoad) ackedKeys() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	keys := make([]string, len(k.acked))
	for n, i := range k.acked {
		keys[n] = writeKey(k.runName, i)
	}
	return keys
}

// verdict is the check's outcome: every acknowledged write there with its
// value, every read found it, the fill whole. writes and reads name the
// service's commands ("writes", "sets").
func (k *kvLoad) verdict(acked, missing, wrong int, fr fillReport, writes, reads string) (bool, string) {
	state := fmt.Sprintf("%s: %d acknowledged, %d missing, %d wrong; %s: %d, %d without the acknowledged value; %s",
		writes, acked, missing, wrong, reads, k.reads.Load(), k.badReads.Load(), fr)
	return missing == 0 && wrong == 0 && k.badReads.Load() == 0 && fr.ok(), state
}

// compareValues reads keys in batches of checkBatch through get (the
// values of the keys present) and counts those absent and those not
// holding value(key, size).
func compareValues(keys []string, size int, get func(batch []string) (map[string][]byte, error)) (missing, wrong int, err error) {
	for len(keys) > 0 {
		batch := keys[:min(checkBatch, len(keys))]
		keys = keys[len(batch):]
		got, err := get(batch)
		if err != nil {
			return 0, 0, err
		}
		for _, key := range batch {
			v, ok := got[key]
			switch {
			case !ok:
				missing++
			case string(v) != string(value(key, size)):
				wrong++
			}
		}
	}
	return missing, wrong, nil
}

// checkFillKeys checks a redis or memcached fill whose marker says how
// many fill:<n> keys of what size it wrote, through compare.
func checkFillKeys(marker string, compare func(keys []string, size int) (missing, wrong int, err error)) (fillReport, error) {
	items, size, err := parseFillMarker(marker)
	if err != nil {
		return fillReport{}, err
	}
	keys := make([]string, items)
	for i := range keys {
		keys[i] = fillKey(i)
	}
	r := fillReport{Items: items, Size: size}
	r.Missing, r.Wrong, err = compare(keys, size)
	return r, err
}
