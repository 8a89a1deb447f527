package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
)

// recordSize is one journal record: a page of words derived from the
// seed and the record's number, so a record lost, torn or stale shows.
const recordSize = 4096

// journal appends records to a file (on a volume, in the tests) at a set
// rate; VERIFY reads the file back against what was written.
type journal struct {
	f       *os.File
	seed    uint64
	mu      sync.Mutex // held while a record is written, and by check
	records uint64
}

func openJournal(path string, seed uint64) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return &journal{f: f, seed: seed}, nil
}

// record is record i's contents.
func (j *journal) record(i uint64, b []byte) {
	rng := splitmix(j.seed ^ (i * 0x9e3779b97f4a7c15))
	binary.LittleEndian.PutUint64(b, i)
	for o := 8; o < recordSize; o += 8 {
		binary.LittleEndian.PutUint64(b[o:], rng.next())
	}
}

// fill writes n bytes of records at once.
func (j *journal) fill(n uint64) error {
	b := make([]byte, recordSize)
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.records*recordSize < n {
		if err := j.writeNext(b); err != nil {
			return err
		}
	}
	return nil
}

// writeNext writes the next record at its place (not appended: a record
// the file lost leaves a hole that check finds), in b. The caller holds
// mu.
func (j *journal) writeNext(b []byte) error {
	j.record(j.records, b)
	if _, err := j.f.WriteAt(b, int64(j.records*recordSize)); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.records++
	return nil
}

// writeLoop writes rate bytes per second of its own running time, in
// whole records.
func (j *journal) writeLoop(rate float64) {
	b := make([]byte, recordSize)
	paced(rate/recordSize, func(n uint64) bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		for range n {
			if err := j.writeNext(b); err != nil {
				fmt.Fprintln(os.Stderr, "memhog:", err)
				return false
			}
		}
		return true
	})
}

// check reads the file back: exactly the records written, each intact.
func (j *journal) check() (records, bad uint64, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	st, err := j.f.Stat()
	if err != nil || st.Size() != int64(j.records*recordSize) {
		return j.records, j.records, false
	}
	want := make([]byte, recordSize)
	got := make([]byte, recordSize)
	for i := range j.records {
		j.record(i, want)
		if _, err := j.f.ReadAt(got, int64(i*recordSize)); err != nil && err != io.EOF {
			bad++
			continue
		}
		if string(got) != string(want) {
			bad++
		}
	}
	return j.records, bad, bad == 0
}
