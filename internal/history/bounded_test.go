package history

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// EndUnknownBy records an Unknown outcome with a return time; End(Unknown) records none.
func TestEndUnknownBySetsReturn(t *testing.T) {
	r := NewRecorder("p", nil)
	r.Begin(Op{Client: "a", Key: "k", Kind: Acquire}).EndUnknownBy()
	r.Begin(Op{Client: "b", Key: "k", Kind: Acquire}).End(Unknown, 0)
	ops := r.Ops()
	assert.Equal(t, Unknown, ops[0].Outcome)
	assert.GreaterOrEqual(t, ops[0].Return, ops[0].Call)
	assert.NotZero(t, ops[0].Return)
	assert.Zero(t, ops[1].Return)
}

// A settled Unknown acquire may have held the key only until its return: a Busy seen
// inside that window is explained by it, one seen after it by nothing (it would be,
// were the acquire never settled).
func TestSettledUnknownAcquireHoldsOnlyUntilItsReturn(t *testing.T) {
	unknown := Op{Proc: "p", ID: 1, Client: "a", Key: "k", Kind: Acquire, Call: 10, Return: 20, Outcome: Unknown}
	busy := func(call, ret int64) Op {
		return Op{Proc: "p", ID: 2, Client: "b", Key: "k", Kind: Acquire, Call: call, Return: ret, Outcome: Busy}
	}
	assert.Equal(t, porcupine.Ok, Run(LockModel(), []Op{unknown, busy(12, 15)}, 10*time.Second).Result)
	v := Run(LockModel(), []Op{unknown, busy(30, 35)}, 10*time.Second)
	assert.Equal(t, porcupine.Illegal, v.Result)
	unsettled := unknown
	unsettled.Return = 0
	assert.Equal(t, porcupine.Ok, Run(LockModel(), []Op{unsettled, busy(30, 35)}, 10*time.Second).Result)

	// WriteHTML writes the visualisation of the illegal one.
	path := filepath.Join(t.TempDir(), "v.html")
	require.NoError(t, v.WriteHTML(path))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Positive(t, st.Size())
}
