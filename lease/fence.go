package lease

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// FenceConfig describes a protected table: rows that must only be written by
// the current lease holder. Each row stores the highest fencing token that
// has written it.
type FenceConfig struct {
	// Schema of the table. Empty: the connection's search_path decides.
	Schema string
	// Table holding the protected rows. Required.
	Table string
	// KeyColumn identifies a row; it must be unique. Default "id".
	KeyColumn string
	// TokenColumn is a bigint NOT NULL DEFAULT 0 holding the highest token
	// accepted so far. Default "fence_token".
	TokenColumn string
}

// Fence performs protected writes: an UPDATE that succeeds only if the
// caller's fencing token is not older than the one the row last accepted.
//
// A lease only promises exclusion while its holder is alive and on time; a
// holder that was paused (GC, swap, a slow network) past its TTL can wake up
// and write after a new holder has started. Fencing closes that gap at the
// point of the write: the new holder's token is larger, so once it has
// written, the old holder's writes are rejected. This needs the protected
// store to check the token, which is why it is a separate, explicit step.
type Fence struct {
	table, key, token string // quoted
}

// NewFence validates cfg. It sends nothing to the database. Errors wrap ErrInvalid.
func NewFence(cfg FenceConfig) (*Fence, error) {
	const op = "new fence"
	if cfg.KeyColumn == "" {
		cfg.KeyColumn = "id"
	}
	if cfg.TokenColumn == "" {
		cfg.TokenColumn = "fence_token"
	}
	if cfg.Schema != "" {
		if err := checkIdentifier("schema", cfg.Schema); err != nil {
			return nil, opError(op, "", err)
		}
	}
	for what, name := range map[string]string{"table": cfg.Table, "key column": cfg.KeyColumn, "token column": cfg.TokenColumn} {
		if err := checkIdentifier(what, name); err != nil {
			return nil, opError(op, "", err)
		}
	}
	if err := checkTable(cfg.Table); err != nil {
		return nil, opError(op, "", err)
	}
	if cfg.KeyColumn == cfg.TokenColumn {
		return nil, opError(op, "", fmt.Errorf("%w: key and token columns must differ", ErrInvalid))
	}
	return &Fence{table: qualify(cfg.Schema, cfg.Table), key: quote(cfg.KeyColumn), token: quote(cfg.TokenColumn)}, nil
}

// Querier is what a protected write needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
// Unlike lease operations, a fenced write may well belong in the caller's
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Update sets the given columns of the row whose key column equals key, and
// records token in the token column, provided the row's current token is
// less than or equal to token. It is one statement:
//
//	UPDATE t SET c1 = $3, ..., fence_token = $2
//	WHERE id = $1 AND fence_token <= $2
//
// Equal tokens pass so that one holder can write several times under one
// acquisition; a strictly smaller token is stale. (Use a strict < in your own
// SQL if each acquisition may write at most once.)
//
// Column names are quoted; values are bind parameters. ctx governs the
// statement. It returns ErrLeaseLost (stale token: a later holder has
// written), ErrNotFound (no such row) or ErrInvalid (no columns, bad names,
// the token column among them, or a key refused as a column lease's row id
// is: nil, typed nil, or a string-like key (a string or named string type, a
// []byte, or a pointer to one of them) with a NUL byte or invalid UTF-8, or
// longer than MaxResourceLen), found before any SQL is sent. A []byte key is
// checked as text, so a bytea key column takes only UTF-8 keys without NUL.
func (f *Fence) Update(ctx context.Context, db Querier, key any, token int64, set map[string]any) error {
	const op = "fenced update"
	resource := resourceOf(key)
	if err := checkID(key); err != nil {
		return opError(op, resource, err)
	}
	if len(set) == 0 {
		return opError(op, resource, fmt.Errorf("%w: no columns to set", ErrInvalid))
	}
	names := make([]string, 0, len(set))
	for name := range set {
		if err := checkIdentifier("column", name); err != nil {
			return opError(op, resource, err)
		}
		if quote(name) == f.token || quote(name) == f.key {
			return opError(op, resource, fmt.Errorf("%w: the key and token columns are not settable", ErrInvalid))
		}
		names = append(names, name)
	}
	slices.Sort(names) // stable SQL text: one prepared statement per column set
	args := []any{key, token}
	var sets strings.Builder
	for i, name := range names {
		fmt.Fprintf(&sets, "%s = $%d, ", quote(name), i+3)
		args = append(args, set[name])
	}
	sql := fmt.Sprintf(`
WITH written AS (
	UPDATE %[1]s SET %[2]s%[3]s = $2
	WHERE %[4]s = $1 AND %[3]s <= $2
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM written), EXISTS (SELECT 1 FROM %[1]s WHERE %[4]s = $1)`,
		f.table, sets.String(), f.token, f.key)
	var ok, exists bool
	if err := db.QueryRow(ctx, sql, args...).Scan(&ok, &exists); err != nil {
		return opError(op, resource, err)
	}
	switch {
	case ok:
		return nil
	case !exists:
		return opError(op, resource, ErrNotFound)
	default:
		return opError(op, resource, ErrLeaseLost)
	}
}
