package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgxlock/pgxlock/internal/pgtest"
	"github.com/pgxlock/pgxlock/lease"
)

// TestMigrateNewlineInIdentifierInjection: a table or schema name with a CR
// or LF once passed NewManager, and the line break inside the quoted name
// ended a -- comment of manager_schema.sql that held a placeholder, so the
// rest of the name ran as SQL in Migrate. Identifiers with any control
// character are now refused in every form, and the templates' comments are
// removed before substitution.
func TestMigrateNewlineInIdentifierInjection(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	s := pgtest.Schema(t, pool)
	victim := "rv" + s[len(s)-8:]
	if _, err := pool.Exec(ctx, "CREATE TABLE public."+victim+" (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS public."+victim) })
	for _, brk := range []string{"\r", "\n", "\r\n"} {
		table := "x" + brk + "DROP TABLE IF EXISTS public." + victim + ";--"
		if m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: s, Table: table, TTL: time.Second}); err == nil {
			t.Errorf("NewManager accepted table %q", table)
			_ = m.Migrate(ctx)
		} else if !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("table %q: %v, want ErrInvalid", table, err)
		}
		if m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: "s" + brk + "x", TTL: time.Second}); err == nil {
			t.Errorf("NewManager accepted schema with %q", brk)
			_ = m.Migrate(ctx)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1", victim).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("Migrate dropped public.%s through the table name", victim)
	}
}

// TestIdentifierControlCharacters: every identifier checker (manager,
// column, fence, Fence.Update's column names) refuses 0x00-0x1F and 0x7F
// with ErrInvalid.
func TestIdentifierControlCharacters(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, c := range []string{"\x00", "\x01", "\t", "\n", "\r", "\x1f", "\x7f"} {
		name := "a" + c + "b"
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, lease.ErrInvalid) {
				t.Errorf("%s with %q: %v, want ErrInvalid", what, c, err)
			}
		}
		_, err := lease.NewManager(pool, lease.ManagerConfig{Table: name, TTL: time.Second})
		check("manager table", err)
		_, err = lease.NewManager(pool, lease.ManagerConfig{Schema: name, TTL: time.Second})
		check("manager schema", err)
		_, err = lease.NewManager(pool, lease.ManagerConfig{Channel: name, TTL: time.Second})
		check("manager channel", err)
		for _, cfg := range []lease.ColumnConfig{
			{Table: name}, {Table: "t", Schema: name}, {Table: "t", IDColumn: name},
			{Table: "t", LockedAtColumn: name}, {Table: "t", OwnerColumn: name}, {Table: "t", FenceColumn: name},
		} {
			cfg.TTL = time.Second
			_, err = lease.NewColumn(pool, cfg)
			check("column config", err)
		}
		for _, cfg := range []lease.FenceConfig{{Table: name}, {Table: "t", Schema: name}, {Table: "t", KeyColumn: name}, {Table: "t", TokenColumn: name}} {
			_, err = lease.NewFence(cfg)
			check("fence config", err)
		}
		f, err := lease.NewFence(lease.FenceConfig{Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		check("fence update column", f.Update(ctx, pool, 1, 1, map[string]any{name: 1}))
	}
}

// TestSchemaSQLHasNoComments: Migrate's DDL carries no -- comment after
// substitution, so no substituted name can sit inside one.
func TestSchemaSQLHasNoComments(t *testing.T) {
	m, err := lease.NewManager(pgtest.Pool(t), lease.ManagerConfig{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if sql := m.SchemaSQLForTest(); strings.Contains(sql, "--") {
		t.Errorf("schema SQL contains a -- comment:\n%s", sql)
	}
	if sql := m.SchemaSQLForTest(); !strings.Contains(sql, "CREATE INDEX IF NOT EXISTS") {
		t.Errorf("schema SQL lost its statements:\n%s", sql)
	}
}
