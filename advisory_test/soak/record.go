package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// An event is one operation of one client (a goroutine of a worker process) on one key,
// as the worker saw it: what it called, when (call and return on the machine-wide
// monotonic clock, so events of every worker merge into one history), and the outcome.
//
// A critical section becomes two events: "acquire" (call: the lock call starts; return:
// the lock is known held, i.e. the callback starts or the handle is returned) and then
// either "release" (call: the callback ends or Unlock starts; return: the call returned
// without error, which for every form means the server has released the key) or "lost"
// (the section ended in an error, so the lock may have vanished at any point after the
// acquire returned; return: the worker saw, in pg_locks through another connection, that
// the holding backend no longer holds the key, or Return is -1 when it could not tell).
type event struct {
	Client int    `json:"c"`
	Key    int    `json:"k"` // index into the run's keys
	Op     string `json:"op"`
	Shared bool   `json:"sh,omitempty"`
	// Result of an acquire: "ok", "busy" (a Try call found the key taken), "timeout"
	// (lock_timeout or the call's deadline), or "failed" (another error: the call did not
	// hold the key when it returned; it may have held it for a moment before, on a
	// connection it then destroyed). "ok" for release and lost.
	Result string `json:"r"`
	Call   int64  `json:"t0"`
	Return int64  `json:"t1"` // -1: unknown (never observed)
	Via    string `json:"via"`
}

// journal appends events to a JSON-lines file. Safe for concurrent use.
type journal struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	err error
}

func createJournal(path string) (*journal, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	return &journal{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

func (j *journal) add(e event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil {
		j.err = j.enc.Encode(e)
	}
}

// close flushes and closes the file, returning the first error seen.
func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.w.Flush(); j.err == nil {
		j.err = err
	}
	if err := j.f.Close(); j.err == nil {
		j.err = err
	}
	return j.err
}

// readJournal reads the events a worker wrote. A torn last line (the worker was killed
// while writing) is reported as an error: the history would be incomplete.
func readJournal(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []event
	dec := json.NewDecoder(bufio.NewReader(f))
	for dec.More() {
		var e event
		if err := dec.Decode(&e); err != nil {
			return out, fmt.Errorf("%s: event %d: %w", path, len(out)+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}
