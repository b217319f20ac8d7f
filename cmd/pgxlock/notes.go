package main

import (
	"io"
	"sync"
	"time"
)

// notes writes the CLI's own messages on a goroutine of its own, in order,
// so that a stream nobody reads (a full pipe, a stopped terminal) never
// holds the caller: while pgxlock supervises a command, a blocked "lock
// lost" message would hold back the SIGTERM it announces, and signals;
// while it watches, the exit a signal asks for. What does not fit the queue
// is dropped. Writes never fail.
type notes struct {
	w    io.Writer
	mu   sync.Mutex
	q    chan []byte // nil once closed
	done chan struct{}
}

// notesQueue is how many messages may wait for a slow stream.
const notesQueue = 64

// notesDrain bounds how long close waits for queued messages to be
// written: a stream nobody reads must not keep pgxlock (and its exit
// status) from ending.
const notesDrain = time.Second

func newNotes(w io.Writer) *notes {
	q := make(chan []byte, notesQueue)
	n := &notes{w: w, q: q, done: make(chan struct{})}
	go func() { // owned: close waits for it (bounded)
		defer close(n.done)
		for p := range q { // q, not n.q, which close sets to nil
			_, _ = n.w.Write(p)
		}
	}()
	return n
}

// Write queues a copy of p.
func (n *notes) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.q != nil {
		select {
		case n.q <- append([]byte(nil), p...):
		default: // the stream is stuck: drop
		}
	}
	return len(p), nil
}

// close stops taking messages and waits at most notesDrain for the queued
// ones to be written.
func (n *notes) close() {
	n.mu.Lock()
	if n.q != nil {
		close(n.q)
		n.q = nil
	}
	n.mu.Unlock()
	t := time.NewTimer(notesDrain)
	defer t.Stop()
	select {
	case <-n.done:
	case <-t.C:
	}
}
