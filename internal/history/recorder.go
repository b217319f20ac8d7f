package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// Kind is what an operation does.
type Kind string

// The kinds of operation the models know.
const (
	Acquire Kind = "acquire" // take the lock (Shared for a shared lock) or the lease
	Release Kind = "release" // give it back
	Lost    Kind = "lost"    // the holder's lock vanished between the call and the return
	Write   Kind = "write"   // a protected write through lease.Fence with Token
)

// Outcome is how an operation ended.
type Outcome string

// The outcomes. An operation recorded with Begin and never ended counts as Unknown.
const (
	OK       Outcome = "ok"       // it took effect (acquired, released, write accepted)
	Busy     Outcome = "busy"     // a try found the key held
	Timeout  Outcome = "timeout"  // a wait ended, the key still held, without acquiring
	Rejected Outcome = "rejected" // a fenced write was refused as stale
	Unknown  Outcome = "unknown"  // it may or may not have taken effect
)

// Op is one recorded operation. Call and Return are readings of [Now]; Return is 0
// while the operation is pending and for an Unknown outcome.
type Op struct {
	Proc    string  `json:"proc"`             // the recorder that made it
	ID      int64   `json:"id"`               // unique within Proc
	Client  string  `json:"client"`           // who acted: one goroutine or lock handle
	Key     string  `json:"key"`              // the lock key or lease resource
	Kind    Kind    `json:"kind"`             //
	Shared  bool    `json:"shared,omitempty"` // an Acquire in shared mode
	Token   int64   `json:"token,omitempty"`  // fencing token: issued (Acquire) or used (Write)
	Call    int64   `json:"call"`             //
	Return  int64   `json:"ret,omitempty"`    //
	Outcome Outcome `json:"out,omitempty"`    // empty while pending
}

// Recorder collects operations. It is safe for concurrent use. The zero value is not
// usable; call [NewRecorder].
type Recorder struct {
	proc string
	mu   sync.Mutex
	w    io.Writer
	werr error
	ops  []Op
}

// NewRecorder returns a recorder whose operations carry proc (unique per process of a
// test). If w is not nil, every operation is written to it as one JSON line when it is
// called and again when it returns; each line is one Write call, so an *os.File keeps
// what a killed process recorded up to its death.
func NewRecorder(proc string, w io.Writer) *Recorder {
	return &Recorder{proc: proc, w: w}
}

// Pending is an operation that has been called and has not returned.
type Pending struct {
	r *Recorder
	i int
}

// Begin records the call of op now, filling its Proc, ID and Call, and returns the
// handle that records its return. Set Client, Key, Kind and, where they apply, Shared
// and Token (a Write's token) in op.
func (r *Recorder) Begin(op Op) *Pending {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Proc, op.ID, op.Return, op.Outcome = r.proc, int64(len(r.ops)), 0, ""
	op.Call = Now()
	r.ops = append(r.ops, op)
	r.emit(op)
	return &Pending{r: r, i: len(r.ops) - 1}
}

// Call returns the operation's call time, a reading of [Now].
func (p *Pending) Call() int64 {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	return p.r.ops[p.i].Call
}

// End records the return of the operation now with its outcome and, for an Acquire
// that issued one, the fencing token (0: none). With Unknown the operation stays open
// to the end of the history. End is to be called once.
func (p *Pending) End(out Outcome, token int64) {
	now := Now()
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	op := &p.r.ops[p.i]
	op.Outcome = out
	if out != Unknown {
		op.Return = now
	}
	if token != 0 {
		op.Token = token
	}
	p.r.emit(*op)
}

// Lost records that client's lock on key vanished at some moment after since (a
// reading of [Now] at which the lock was last known held, e.g. the call time of the
// acquisition or of the last statement that succeeded on the holding connection) and
// before until (a reading at which it was known gone: the holder saw its backend end,
// or pg_locks showed the key free). until 0 means not known: the end of the history.
// Seeing ErrLockLost alone does not bound it: after a silent partition the server may
// hold the lock long after the client gave up.
func (r *Recorder) Lost(client, key string, since, until int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := Op{Proc: r.proc, ID: int64(len(r.ops)), Client: client, Key: key, Kind: Lost, Call: since, Return: until, Outcome: OK}
	if until == 0 {
		op.Outcome = Unknown
	}
	r.ops = append(r.ops, op)
	r.emit(op)
}

// emit writes op as a JSON line; r.mu is held. The first write error is kept for Err.
func (r *Recorder) emit(op Op) {
	if r.w == nil || r.werr != nil {
		return
	}
	b, err := json.Marshal(op)
	if err == nil {
		_, err = r.w.Write(append(b, '\n'))
	}
	r.werr = err
}

// Err returns the first error writing to the recorder's writer.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.werr
}

// Ops returns a copy of the operations recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// ReadFile reads the JSON lines a recorder wrote to path (several recorders may share
// the file) and returns one Op per operation: the last line written for it. A torn last
// line (the writer was killed mid-write) is ignored.
func ReadFile(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	type id struct {
		proc string
		id   int64
	}
	var ops []Op
	at := map[id]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var bad error
	for n := 1; sc.Scan(); n++ {
		if bad != nil { // only the last line may be torn
			return nil, bad
		}
		var op Op
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			bad = fmt.Errorf("history: %s line %d: %w", path, n, err)
			continue
		}
		k := id{op.Proc, op.ID}
		if i, ok := at[k]; ok {
			ops[i] = op
			continue
		}
		at[k] = len(ops)
		ops = append(ops, op)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("history: %s: %w", path, err)
	}
	return ops, nil
}

// Crashed returns ops plus, for every client of proc that may still have held a key
// when proc died (its last Acquire on the key succeeded and nothing released or lost it
// since), a Lost from that Acquire's call to the end of the history: the server drops
// a dead session's locks at a moment the history does not show.
func Crashed(ops []Op, proc string) []Op {
	type ck struct{ client, key string }
	last := map[ck]Op{}
	for _, op := range ops {
		if op.Proc != proc || op.Kind == Write {
			continue
		}
		k := ck{op.Client, op.Key}
		if prev, ok := last[k]; !ok || op.Call >= prev.Call {
			last[k] = op
		}
	}
	out := append([]Op(nil), ops...)
	n := int64(0)
	for k, op := range last {
		if op.Kind == Acquire && op.Outcome == OK {
			n++
			out = append(out, Op{Proc: proc + "/crash", ID: n, Client: k.client, Key: k.key, Kind: Lost, Call: op.Call, Outcome: Unknown})
		}
	}
	return out
}
