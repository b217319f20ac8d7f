package history

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
	Took   time.Duration         // porcupine's run time

	model porcupine.Model
	info  porcupine.LinearizationInfo
}

func (v Verdict) String() string {
	return fmt.Sprintf("%s: %d operations on %d keys checked in %v", v.Result, v.Ops, v.Keys, v.Took.Round(time.Millisecond))
}

// Operations converts ops to porcupine's form: an operation with an Unknown outcome, or
// none (pending), returns at the end of the history (at its Return if [Pending.EndUnknownBy]
// settled it), and an Acquire among them gets a Lost of its client and key: from its
// call to the end of the history, or, when settled, just after its return.
func Operations(ops []Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Call, op.Return)
	}
	end++
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
	add := func(op Op, res Outcome, ret int64) {
		out = append(out, porcupine.Operation{
			ClientId: client(op.Client),
			Input:    input{client: client(op.Client), name: op.Client, kind: op.Kind, shared: op.Shared, token: op.Token},
			Call:     op.Call,
			Output:   res,
			Return:   ret,
			Metadata: op.Key,
		})
	}
	for _, op := range ops {
		res, ret := op.Outcome, op.Return
		if res == "" || ret == 0 { // pending, or Unknown never settled (EndUnknownBy settles it)
			res, ret = Unknown, end
		}
		add(op, res, ret)
		if op.Kind == Acquire && res == Unknown {
			lost := Op{Client: op.Client, Key: op.Key, Kind: Lost}
			if ret == end {
				add(lost, OK, end)
				out[len(out)-1].Call = op.Call
			} else {
				// Settled by EndUnknownBy: the lock, if taken, went by ret. The Lost
				// follows the Acquire in real time, so it cannot be ordered first.
				add(lost, OK, ret+2)
				out[len(out)-1].Call = ret + 1
			}
		}
	}
	return out
}

// Run checks ops against model with porcupine, giving up after timeout.
func Run(model porcupine.Model, ops []Op, timeout time.Duration) Verdict {
	pops := Operations(ops)
	keys := map[any]bool{}
	for _, op := range pops {
		keys[op.Metadata] = true
	}
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, pops, timeout)
	return Verdict{Result: res, Ops: len(pops), Keys: len(keys), Took: time.Since(start), model: model, info: info}
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
