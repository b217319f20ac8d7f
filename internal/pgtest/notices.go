package pgtest

import (
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NoisyConfig is Config with client_min_messages = debug5, so that every
// answer of the server carries notices, and an OnNotice that calls
// onNotice for each: a way to run code of the pool's inside any read of
// any statement.
func NoisyConfig(t testing.TB, onNotice func()) *pgxpool.Config {
	t.Helper()
	cfg := Config(t)
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug5"
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { onNotice() }
	return cfg
}

// Trap panics with its value the first time it is sprung after Arm, and
// does nothing otherwise: give Spring to a hook (NoisyConfig's onNotice,
// say) and Arm it just before the statement that must meet the panic.
type Trap struct {
	armed atomic.Bool
	value any
}

// NewTrap returns a disarmed Trap that panics with value.
func NewTrap(value any) *Trap { return &Trap{value: value} }

// Arm makes the next Spring panic.
func (p *Trap) Arm() { p.armed.Store(true) }

// Spring panics if the trap is armed, disarming it.
func (p *Trap) Spring() {
	if p.armed.CompareAndSwap(true, false) {
		panic(p.value)
	}
}
