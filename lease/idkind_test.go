package lease_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

type namedID string

type namedBytes []byte

// TestIDNotPlainStringSkipsValidation: an id (or Fence.Update key) that was
// not a plain string, such as a named string type, a *string or a []byte,
// skipped the NUL / UTF-8 / length checks, reached SQL (22021, 22P02) and,
// for a 1 MB input, had the whole input echoed in the error. Every
// string-like id is now checked, and no error text carries the input whole.
func TestIDNotPlainStringSkipsValidation(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	s := pgtest.Schema(t, pool)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+s+".u (id bigint primary key, tid text unique)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+s+".u VALUES (5, 'five')"); err != nil {
		t.Fatal(err)
	}
	c, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: s, Table: "u", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("A", 1<<20)
	nul := "a\x00b"
	bad := "a\xffb"
	pnul := &nul
	var nilp *string
	ids := map[string]any{
		"named NUL": namedID(nul), "*string NUL": &nul, "**string NUL": &pnul, "[]byte NUL": []byte(nul),
		"named invalid utf8": namedID(bad), "*string invalid utf8": &bad, "[]byte invalid utf8": []byte(bad),
		"named []byte invalid utf8": namedBytes(bad), "*named invalid utf8": func() *namedID { v := namedID(bad); return &v }(),
		"*string 1MB": &long, "named 1MB": namedID(long), "[]byte 1MB": []byte(long),
		"**string nil": &nilp,
	}
	const maxErr = 2000
	for name, id := range ids {
		_, err := c.TryAcquire(ctx, id)
		if !errors.Is(err, lease.ErrInvalid) || len(err.Error()) > maxErr {
			t.Errorf("column %s: ErrInvalid=%v len(err)=%d: %.200q", name, errors.Is(err, lease.ErrInvalid), len(err.Error()), err)
		}
	}
	f, err := lease.NewFence(lease.FenceConfig{Schema: s, Table: "u", KeyColumn: "tid", TokenColumn: "lock_fence"})
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range ids {
		err := f.Update(ctx, pool, key, 1, map[string]any{"id": 5})
		if !errors.Is(err, lease.ErrInvalid) || len(err.Error()) > maxErr {
			t.Errorf("fence %s: ErrInvalid=%v len(err)=%d: %.200q", name, errors.Is(err, lease.ErrInvalid), len(err.Error()), err)
		}
	}
	// The string-like ids that are fine still work, and print as text.
	five := "five"
	if err := f.Update(ctx, pool, &five, 1, map[string]any{"id": 5}); err != nil {
		t.Errorf("fence *string key: %v", err)
	}
	if err := f.Update(ctx, pool, namedID("five"), 1, map[string]any{"id": 5}); err != nil {
		t.Errorf("fence named key: %v", err)
	}
	err = f.Update(ctx, pool, &nul, 1, map[string]any{"id": 5})
	var le *lease.Error
	if !errors.As(err, &le) || le.Resource != nul {
		t.Errorf("fence *string key is not printed as its text: %#v", le)
	}
}

// valuerID is an id type the package cannot check: pgx sends whatever Value
// returns.
type valuerID struct{ s string }

func (v valuerID) Value() (driver.Value, error) { return v.s, nil }

// TestErrorTextCapsEchoedInput: an id the package cannot check, quoted back
// whole by the server (22P02 on a bigint column), is not copied whole into
// the error text; the *pgconn.PgError stays in the chain.
func TestErrorTextCapsEchoedInput(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	s := pgtest.Schema(t, pool)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+s+".u (id bigint primary key)"); err != nil {
		t.Fatal(err)
	}
	c, err := lease.NewColumn(pool, lease.ColumnConfig{Schema: s, Table: "u", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, valuerID{strings.Repeat("A", 1<<20)})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" {
		t.Fatalf("TryAcquire: %.300v, want 22P02 in the chain", err)
	}
	if n := len(err.Error()); n > 6000 {
		t.Errorf("error text is %d bytes", n)
	}
}
