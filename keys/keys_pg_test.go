package keys_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/keys"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// PostgreSQL's recipes from doc.go, as the server runs them.
const (
	pgHashText  = `SELECT ('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint`
	pgHashBytea = `SELECT ('x' || left(encode(sha256($1::bytea), 'hex'), 16))::bit(64)::bigint`
	pgNsPrefix  = `convert_to('pgxlock:v1', 'UTF8') || '\x00'::bytea || int4send($1::int4) || '\x00'::bytea`
	pgNsText    = `SELECT ('x' || left(encode(sha256(` + pgNsPrefix + ` || convert_to($2::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint`
	pgNsBytea   = `SELECT ('x' || left(encode(sha256(` + pgNsPrefix + ` || $2::bytea), 'hex'), 16))::bit(64)::bigint`
)

func TestHashMatchesPostgres(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, g := range hashGoldens {
		var got int64
		if !g.notText {
			if err := pool.QueryRow(ctx, pgHashText, g.s).Scan(&got); err != nil {
				t.Fatalf("text recipe for %+q: %v", g.s, err)
			}
			if got != g.want {
				t.Errorf("PostgreSQL text recipe for %+q = %d, golden %d", g.s, got, g.want)
			}
		}
		// Every input, NUL and invalid UTF-8 included, as raw bytes.
		if err := pool.QueryRow(ctx, pgHashBytea, []byte(g.s)).Scan(&got); err != nil {
			t.Fatalf("bytea recipe for %+q: %v", g.s, err)
		}
		if got != g.want {
			t.Errorf("PostgreSQL bytea recipe for %+q = %d, golden %d", g.s, got, g.want)
		}
	}
}

func TestNamespaceHashMatchesPostgres(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, g := range nsHashGoldens {
		var got int64
		if !g.notText {
			if err := pool.QueryRow(ctx, pgNsText, g.id, g.s).Scan(&got); err != nil {
				t.Fatalf("text recipe for (%d, %+q): %v", g.id, g.s, err)
			}
			if got != g.want {
				t.Errorf("PostgreSQL text recipe for (%d, %+q) = %d, golden %d", g.id, g.s, got, g.want)
			}
		}
		if err := pool.QueryRow(ctx, pgNsBytea, g.id, []byte(g.s)).Scan(&got); err != nil {
			t.Fatalf("bytea recipe for (%d, %+q): %v", g.id, g.s, err)
		}
		if got != g.want {
			t.Errorf("PostgreSQL bytea recipe for (%d, %+q) = %d, golden %d", g.id, g.s, got, g.want)
		}
	}
}

// TestPgLocksRoundTrip takes real advisory locks in both spaces, negative
// keys included, reads them back from pg_locks, and checks that FromPgLocks
// decodes each row to the Key that was locked and that Key.PgLocks finds it.
func TestPgLocksRoundTrip(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A failure part-way must not hand a locked session back to the pool.
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		if _, err := conn.Exec(cctx, `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Errorf("cleanup: pg_advisory_unlock_all: %v", err)
			_ = conn.Conn().Close(cctx) // a closed connection is destroyed on Release
		}
		conn.Release()
	})

	// Advisory keys are database-wide: random parts keep this test's keys
	// apart from concurrently running tests; the fixed edge values are what
	// exercise the sign bits of classid and objid.
	r := randInt64(t)
	pa, pb := abs32(int32(r>>32)|1), abs32(int32(r)|1) // odd, so > 0 and never MinInt32
	ns := goldenNamespace(t, math.MinInt32)
	nsHashed, err := ns.Hash("keys_pg_test")
	if err != nil {
		t.Fatal(err)
	}
	locked := []keys.Key{
		keys.Int64(r | math.MinInt64), // negative
		keys.Int64(r & math.MaxInt64), // non-negative
		keys.Int64(math.MinInt64),
		keys.Int64(math.MaxInt64),
		keys.Int64(-1),
		keys.Int64(int64(pb) << 1), // high half zero, low half may have its sign bit set
		keys.Hash("keys_pg_test:" + time.Now().String()),
		nsHashed,
		keys.Pair(pa, pb),
		keys.Pair(-pa, -pb),
		keys.Pair(pa, -pb),
		keys.Pair(-pa, pb),
		keys.Pair(-1, -1),
		keys.Pair(math.MinInt32, math.MaxInt32),
		ns.Key(pb),
		ns.Key(-pb),
	}
	want := map[keys.Key]bool{} // key -> shared
	// Normalize: each key once (a second lock would stack), in lock order.
	for i, k := range keys.Normalize(locked) {
		shared := i%3 == 2 // some in share mode: pg_locks shows those keys the same way
		lockAdvisory(ctx, t, conn, k, shared)
		want[k] = shared
	}

	got := heldAdvisory(ctx, t, conn)
	if len(got) != len(want) {
		t.Errorf("pg_locks shows %d advisory locks for this session, want %d: %v", len(got), len(want), got)
	}
	for k, shared := range want {
		mode, ok := got[k]
		if !ok {
			t.Errorf("%v is not in pg_locks (decoded rows: %v)", k, got)
			continue
		}
		if wantMode := map[bool]string{false: "ExclusiveLock", true: "ShareLock"}[shared]; mode != wantMode {
			t.Errorf("%v mode %s, want %s", k, mode, wantMode)
		}
		classid, objid, objsubid := k.PgLocks()
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND pid = pg_backend_pid()
			AND classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&n)
		if err != nil || n != 1 {
			t.Errorf("%v: pg_locks rows matching PgLocks() (%d, %d, %d) = %d, %v; want 1", k, classid, objid, objsubid, n, err)
		}
	}

	for k, shared := range want {
		unlockAdvisory(ctx, t, conn, k, shared)
	}
	if left := heldAdvisory(ctx, t, conn); len(left) != 0 {
		t.Errorf("after unlocking, pg_locks still shows %v", left)
	}
}

func lockAdvisory(ctx context.Context, t *testing.T, conn *pgxpool.Conn, k keys.Key, shared bool) {
	t.Helper()
	fn := "pg_advisory_lock"
	if shared {
		fn += "_shared"
	}
	// A bounded wait that reverts by itself at the end of the statement.
	const wait = ` FROM (SELECT set_config('lock_timeout', '10s', true)) s`
	var err error
	switch k.Space() {
	case keys.SpaceInt64:
		v, _ := k.Int64()
		_, err = conn.Exec(ctx, `SELECT `+fn+`($1::int8)`+wait, v)
	case keys.SpacePair:
		a, b, _ := k.Pair()
		_, err = conn.Exec(ctx, `SELECT `+fn+`($1::int4, $2::int4)`+wait, a, b)
	default:
		t.Fatalf("lock %v: not a lockable key", k)
	}
	if err != nil {
		t.Fatalf("%s %v: %v", fn, k, err)
	}
}

func unlockAdvisory(ctx context.Context, t *testing.T, conn *pgxpool.Conn, k keys.Key, shared bool) {
	t.Helper()
	fn := "pg_advisory_unlock"
	if shared {
		fn += "_shared"
	}
	var ok bool
	var err error
	switch k.Space() {
	case keys.SpaceInt64:
		v, _ := k.Int64()
		err = conn.QueryRow(ctx, `SELECT `+fn+`($1::int8)`, v).Scan(&ok)
	case keys.SpacePair:
		a, b, _ := k.Pair()
		err = conn.QueryRow(ctx, `SELECT `+fn+`($1::int4, $2::int4)`, a, b).Scan(&ok)
	}
	if err != nil || !ok {
		t.Errorf("%s %v = %v, %v; want true", fn, k, ok, err)
	}
}

// heldAdvisory decodes every granted advisory lock of conn's session from
// pg_locks, mapping each key to its mode.
func heldAdvisory(ctx context.Context, t *testing.T, conn *pgxpool.Conn) map[keys.Key]string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT classid, objid, objsubid, mode FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	held := map[keys.Key]string{}
	for rows.Next() {
		var (
			classid, objid uint32
			objsubid       int16
			mode           string
		)
		if err := rows.Scan(&classid, &objid, &objsubid, &mode); err != nil {
			t.Fatal(err)
		}
		k, err := keys.FromPgLocks(classid, objid, objsubid)
		if err != nil {
			t.Fatalf("FromPgLocks(%d, %d, %d): %v", classid, objid, objsubid, err)
		}
		if _, dup := held[k]; dup {
			t.Errorf("%v appears twice in pg_locks", k)
		}
		held[k] = mode
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

func randInt64(t *testing.T) int64 {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return int64(binary.BigEndian.Uint64(b[:]))
}

func abs32(v int32) int32 {
	if v < 0 {
		return -v
	}
	return v
}
