package history

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const childEnv = "PGXLOCK_HISTORY_TEST_CHILD"

// TestClockChild is not a test: run by TestNowIsMachineWide with childEnv set, it prints
// one reading of Now.
func TestClockChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return
	}
	fmt.Printf("now=%d\n", Now())
}

// A reading of Now taken in another process lies between two readings taken here
// before and after: histories of several processes merge on one clock.
func TestNowIsMachineWide(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestClockChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	before := Now()
	out, err := cmd.Output()
	after := Now()
	require.NoError(t, err, "%s", out)
	i := bytes.Index(out, []byte("now="))
	require.GreaterOrEqual(t, i, 0, "%s", out)
	child, err := strconv.ParseInt(strings.Fields(string(out[i+4:]))[0], 10, 64)
	require.NoError(t, err)
	assert.Less(t, before, child)
	assert.Less(t, child, after)
}

// op builds a completed operation for the model tests.
func op(client, key string, kind Kind, call, ret int64, out Outcome) Op {
	return Op{Client: client, Key: key, Kind: kind, Call: call, Return: ret, Outcome: out}
}

func shared(o Op) Op         { o.Shared = true; return o }
func token(o Op, n int64) Op { o.Token = n; return o }

func TestLockModel(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
		ops  []Op
	}{
		{"one after the other", true, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("a", "k", Release, 3, 4, OK),
			op("b", "k", Acquire, 1, 6, OK), op("b", "k", Release, 7, 8, OK)}},
		{"two holders at once", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "k", Acquire, 3, 4, OK),
			op("a", "k", Release, 5, 6, OK), op("b", "k", Release, 7, 8, OK)}},
		{"two keys are independent", true, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "j", Acquire, 3, 4, OK),
			op("a", "k", Release, 5, 6, OK), op("b", "j", Release, 7, 8, OK)}},
		{"shared holders together", true, []Op{
			shared(op("a", "k", Acquire, 1, 2, OK)), shared(op("b", "k", Acquire, 3, 4, OK)),
			op("a", "k", Release, 5, 6, OK), op("b", "k", Release, 7, 8, OK)}},
		{"exclusive during shared", false, []Op{
			shared(op("a", "k", Acquire, 1, 2, OK)), op("b", "k", Acquire, 3, 4, OK),
			op("a", "k", Release, 5, 6, OK)}},
		{"busy while held", true, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "k", Acquire, 3, 4, Busy), op("a", "k", Release, 5, 6, OK)}},
		{"busy while free", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("a", "k", Release, 3, 4, OK), op("b", "k", Acquire, 5, 6, Busy)}},
		{"timeout overlapping a hold", true, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "k", Acquire, 1, 9, Timeout), op("a", "k", Release, 3, 4, OK)}},
		{"release of a lock not held", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "k", Release, 3, 4, OK)}},
		{"release rejected changes nothing it must not", true, []Op{
			op("b", "k", Release, 1, 2, Rejected), op("a", "k", Acquire, 3, 4, OK)}},
		{"lost, then another acquires", true, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("a", "k", Lost, 1, 9, OK),
			op("b", "k", Acquire, 3, 4, OK), op("b", "k", Release, 5, 6, OK)}},
		{"another acquires before the loss window", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("b", "k", Acquire, 3, 4, OK),
			op("a", "k", Lost, 5, 9, OK)}},
		{"unknown acquire may explain a busy", true, []Op{
			op("a", "k", Acquire, 1, 0, Unknown), op("b", "k", Acquire, 3, 4, Busy),
			op("c", "k", Acquire, 5, 6, OK)}},
		{"an unknown acquire does not excuse an overlap", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("u", "k", Acquire, 1, 0, Unknown),
			op("b", "k", Acquire, 3, 4, OK), op("a", "k", Release, 5, 6, OK)}},
		{"a busy before any unknown acquire is still checked", false, []Op{
			op("a", "k", Acquire, 1, 2, OK), op("a", "k", Release, 3, 4, OK),
			op("b", "k", Acquire, 5, 6, Busy), op("u", "k", Acquire, 7, 0, Unknown)}},
		{"pending acquire counts as unknown", true, []Op{
			{Client: "a", Key: "k", Kind: Acquire, Call: 1}, op("b", "k", Acquire, 3, 4, OK)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Run(LockModel(), c.ops, CheckTimeout)
			want := porcupine.Illegal
			if c.ok {
				want = porcupine.Ok
			}
			assert.Equal(t, want, v.Result, "%v", v)
		})
	}
}

func TestLeaseModel(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
		ops  []Op
	}{
		{"tokens rise, writes in order", true, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("a", "r", Write, 3, 4, OK), 1),
			token(op("a", "r", Write, 5, 6, OK), 1),
			token(op("b", "r", Acquire, 7, 8, OK), 2), token(op("b", "r", Write, 9, 10, OK), 2)}},
		{"token issued twice", false, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 5), token(op("b", "r", Acquire, 3, 4, OK), 5)}},
		{"stale write accepted", false, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("b", "r", Acquire, 3, 4, OK), 2),
			token(op("b", "r", Write, 5, 6, OK), 2), token(op("a", "r", Write, 7, 8, OK), 1)}},
		{"stale write rejected", true, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("b", "r", Acquire, 3, 4, OK), 2),
			token(op("b", "r", Write, 5, 6, OK), 2), token(op("a", "r", Write, 7, 8, Rejected), 1)}},
		{"current write rejected", false, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("a", "r", Write, 3, 4, Rejected), 1)}},
		{"concurrent writes may go either way", true, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("b", "r", Acquire, 3, 4, OK), 2),
			token(op("a", "r", Write, 5, 9, OK), 1), token(op("b", "r", Write, 6, 8, OK), 2)}},
		{"unknown write may have landed", true, []Op{
			token(op("a", "r", Acquire, 1, 2, OK), 1), token(op("b", "r", Acquire, 3, 4, OK), 2),
			token(op("b", "r", Write, 5, 0, Unknown), 2), token(op("a", "r", Write, 7, 8, Rejected), 1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Run(LeaseModel(), c.ops, CheckTimeout)
			want := porcupine.Illegal
			if c.ok {
				want = porcupine.Ok
			}
			assert.Equal(t, want, v.Result, "%v", v)
		})
	}
}

// A file written by a recorder whose process died mid-operation reads back with the
// operation pending, and a torn last line is skipped.
func TestRecorderFileKeepsPendingOperations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	f, err := os.Create(path)
	require.NoError(t, err)
	r := NewRecorder("p1", f)
	p := r.Begin(Op{Client: "g0", Key: "k", Kind: Acquire})
	p.End(OK, 0)
	r.Begin(Op{Client: "g0", Key: "k", Kind: Release}) // the process "dies" here
	_, err = f.WriteString(`{"proc":"p1","id":2,"cli`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, r.Err())

	ops, err := ReadFile(path)
	require.NoError(t, err)
	require.Len(t, ops, 2)
	assert.Equal(t, OK, ops[0].Outcome)
	assert.NotZero(t, ops[0].Return)
	assert.Equal(t, Release, ops[1].Kind)
	assert.Empty(t, ops[1].Outcome, "pending")
	assert.Equal(t, r.Ops(), ops)
}

// Crashed lets the next process acquire a key the dead one held: without it the history
// of a killed holder is rejected.
func TestCrashedReleasesTheDeadHolder(t *testing.T) {
	ops := []Op{
		{Proc: "dead", Client: "dead/g0", Key: "k", Kind: Acquire, Call: 1, Return: 2, Outcome: OK},
		{Proc: "live", Client: "live/g0", Key: "k", Kind: Acquire, Call: 3, Return: 6, Outcome: OK},
	}
	assert.Equal(t, porcupine.Illegal, Run(LockModel(), ops, CheckTimeout).Result)
	assert.Equal(t, porcupine.Ok, Run(LockModel(), Crashed(ops, "dead"), CheckTimeout).Result)
}

// failRecorder is a testing.TB that records failures instead of failing.
type failRecorder struct {
	testing.TB
	msgs []string
}

func (f *failRecorder) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

// Check fails the test on an illegal history and names an HTML file that exists.
func TestCheckFailsAndWritesHTML(t *testing.T) {
	ft := &failRecorder{TB: t}
	v := Check(ft, LockModel(), []Op{
		op("a", "k", Acquire, 1, 2, OK), op("b", "k", Acquire, 3, 4, OK),
	})
	assert.Equal(t, porcupine.Illegal, v.Result)
	require.Len(t, ft.msgs, 1)
	msg := ft.msgs[0]
	i := strings.Index(msg, "see ")
	require.GreaterOrEqual(t, i, 0, msg)
	path := msg[i+4:]
	html, err := os.ReadFile(path)
	require.NoError(t, err, msg)
	assert.Contains(t, string(html), "<html")
	t.Logf("%s", msg)
	_ = os.RemoveAll(filepath.Dir(path))

	ok := &failRecorder{TB: t}
	Check(ok, LockModel(), []Op{op("a", "k", Acquire, 1, 2, OK)})
	assert.Empty(t, ok.msgs)
}

// The recorder is safe for concurrent use and gives each operation its own ID.
func TestRecorderConcurrent(t *testing.T) {
	var buf syncBuffer
	r := NewRecorder("p", &buf)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				r.Begin(Op{Client: fmt.Sprint("g", g), Key: "k", Kind: Acquire}).End(Busy, 0)
			}
		})
	}
	wg.Wait()
	ops := r.Ops()
	require.Len(t, ops, 400)
	seen := map[int64]bool{}
	for _, o := range ops {
		assert.False(t, seen[o.ID])
		seen[o.ID] = true
		assert.LessOrEqual(t, o.Call, o.Return)
	}
	assert.Equal(t, 800, bytes.Count(buf.Bytes(), []byte("\n")))
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Bytes()
}
