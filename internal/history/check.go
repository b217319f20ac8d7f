package history

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckTimeout bounds one porcupine run in [Check]. A history that takes longer is too
// long for a test, and counts as a failure.
const CheckTimeout = 30 * time.Second

// Verdict is the result of checking one history.
type Verdict struct {
	Result porcupine.CheckResult // Ok, Illegal, or Unknown (timed out)
	Ops    int                   // operations checked, including added Losts
	Keys   int                   // partitions
	// Relaxed counts the Busy and Timeout results an unknown acquisition may explain,
	// which the lock model therefore does not check (see LockModel).
	Relaxed int
	Took    time.Duration // porcupine's run time

	model porcupine.Model
	info  porcupine.LinearizationInfo
}

func (v Verdict) String() string {
	return fmt.Sprintf("%s: %d operations on %d keys (%d Busy/Timeout relaxed) checked in %v",
		v.Result, v.Ops, v.Keys, v.Relaxed, v.Took.Round(time.Millisecond))
}

// Operations converts ops to porcupine's form. An operation with no outcome (pending), or
// an Unknown one never settled, returns at the end of the history; an Unknown one settled
// by [Pending.EndUnknownBy] returns at its Return. A Busy or Timeout on a key is marked
// relaxed when an acquisition with an unknown outcome on that key was under way at some
// moment of it (called before the Busy returned, and not settled before the Busy was
// called): that acquisition may have held the key for a while (see [LockModel]). An
// Acquire with an unknown outcome is left out: the lock model counts it as a step that
// changes nothing (beyond relaxing those Busys), and as a pending operation it would
// make porcupine's search exponential in the number of such calls.
func Operations(ops []Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Call, op.Return)
	}
	end++
	windows := map[string]*unknownWindows{} // key -> when unknown Acquires were under way
	for _, op := range ops {
		if op.Kind == Acquire && unknown(op) {
			w := windows[op.Key]
			if w == nil {
				w = &unknownWindows{}
				windows[op.Key] = w
			}
			w.add(op.Call, settledReturn(op, end))
		}
	}
	for _, w := range windows {
		w.index()
	}
	clients := map[string]int{}
	client := func(name string) int {
		id, ok := clients[name]
		if !ok {
			id = len(clients)
			clients[name] = id
		}
		return id
	}
	out := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		if op.Kind == Acquire && unknown(op) {
			continue
		}
		res, ret := op.Outcome, op.Return
		if unknown(op) {
			res, ret = Unknown, settledReturn(op, end)
		}
		in := input{client: client(op.Client), name: op.Client, kind: op.Kind, shared: op.Shared, token: op.Token}
		if w := windows[op.Key]; w != nil && (res == Busy || res == Timeout) && w.overlaps(op.Call, ret) {
			in.relaxed = true
		}
		out = append(out, porcupine.Operation{ClientId: in.client, Input: in, Call: op.Call, Output: res, Return: ret, Metadata: op.Key})
	}
	return out
}

func unknown(op Op) bool { return op.Outcome == "" || op.Outcome == Unknown || op.Return == 0 }

// settledReturn is when an unknown op's effect is over: its Return if EndUnknownBy
// settled it, else the end of the history.
func settledReturn(op Op, end int64) int64 {
	if op.Outcome == Unknown && op.Return != 0 {
		return op.Return
	}
	return end
}

// unknownWindows are the intervals [call, return] of one key's unknown Acquires, sorted
// by call, with the running maximum of the returns, so overlaps answers in O(log n).
type unknownWindows struct {
	calls, rets []int64 // rets[i]: the latest return among the first i+1 windows
	raw         [][2]int64
}

func (w *unknownWindows) add(call, ret int64) { w.raw = append(w.raw, [2]int64{call, ret}) }

func (w *unknownWindows) index() {
	slices.SortFunc(w.raw, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var latest int64
	for _, r := range w.raw {
		latest = max(latest, r[1])
		w.calls, w.rets = append(w.calls, r[0]), append(w.rets, latest)
	}
}

// overlaps reports whether some window meets [call, ret].
func (w *unknownWindows) overlaps(call, ret int64) bool {
	// The windows called by ret; the latest return among them must reach call.
	n, _ := slices.BinarySearch(w.calls, ret+1)
	return n > 0 && w.rets[n-1] >= call
}

// Run checks ops against model with porcupine, giving up after timeout.
func Run(model porcupine.Model, ops []Op, timeout time.Duration) Verdict {
	pops := Operations(ops)
	keys := map[any]bool{}
	relaxed := 0
	for _, op := range pops {
		keys[op.Metadata] = true
		if op.Input.(input).relaxed {
			relaxed++
		}
	}
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, pops, timeout)
	return Verdict{Result: res, Ops: len(pops), Keys: len(keys), Relaxed: relaxed, Took: time.Since(start), model: model, info: info}
}

// Check runs the checker on ops and fails t unless the history is linearizable under
// model (a check that times out fails too). On failure it writes porcupine's HTML
// visualisation with [SaveHTML] and names the file. It logs the verdict, with the
// check's cost, either way.
func Check(t testing.TB, model porcupine.Model, ops []Op) Verdict {
	t.Helper()
	v := Run(model, ops, CheckTimeout)
	if v.Result == porcupine.Ok {
		t.Logf("history: %v", v)
		return v
	}
	path, err := SaveHTML(t, v)
	if err != nil {
		t.Errorf("history: %v; writing the visualisation: %v", v, err)
		return v
	}
	t.Errorf("history: %v; not linearizable or not decided: see %s", v, path)
	return v
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// SaveHTML writes porcupine's visualisation of v to a file and returns its path. The
// directory is the test's artifact directory when the test binary runs with
// -artifacts (go test -artifacts, Go 1.26), else a new directory under os.TempDir that
// is kept after the test.
func SaveHTML(t testing.TB, v Verdict) (string, error) {
	t.Helper()
	dir, err := outputDir(t)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, unsafeChars.ReplaceAllString(t.Name(), "_")+".html")
	if err := porcupine.VisualizePath(v.model, v.info, path); err != nil {
		return "", fmt.Errorf("history: %w", err)
	}
	return path, nil
}

// keptDir makes a directory under os.TempDir that outlives the test.
func keptDir() (string, error) {
	dir, err := os.MkdirTemp("", "pgxlock-history-")
	if err != nil {
		return "", fmt.Errorf("history: %w", err)
	}
	return dir, nil
}
