package pooltx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// ResetSQL is the reset of [Conn.Reset] as one simple-protocol string of
// [ResetStatements] statements, for a connection whose identity is the one
// it started with (see below). A caller whose own
// last statement runs in the simple protocol may append the reset to it
// ("...; " + the reset, one round trip) and call [Conn.MarkClean] once the
// whole string has succeeded; [Conn.AppendReset] appends the form fit for
// its connection, which also detects a DEALLOCATE ALL and restores the
// identity and the settings recorded at the connection's first pin
// ([Acquire]): ResetSQL itself returns the session to its identity and
// settings at connection start, so a SET ROLE or a SET that pgxpool's
// AfterConnect ran does not survive it.
//
// The order matters: RESET SESSION AUTHORIZATION goes back to the
// authenticated user (which may leave role at none), RESET ROLE then restores the
// role the connection started with (from the connection string or from
// ALTER ROLE ... SET role); RESET ALL skips both (PostgreSQL flags them
// NO_RESET_ALL). A connection whose identity was changed before it was
// first lent (a SET ROLE or SET SESSION AUTHORIZATION in pgxpool's
// AfterConnect) would go back to the authenticated user's: [Conn.Reset]
// and [Conn.AppendReset] name the identity recorded at its first pin
// ([Acquire]; with [ConnOptions.DeferIdentity], its first [Conn.Lend])
// instead.
const ResetSQL = sqlResetIdentity + "; " + sqlUnlockAll + "; " + sqlResetRest

// ResetStatements is the number of statements, so of results, in
// [ResetSQL]. What [Conn.AppendReset] appends has [Conn.ResetCount].
const ResetStatements = 8

const (
	sqlResetIdentity = "RESET SESSION AUTHORIZATION; RESET ROLE"
	sqlUnlockAll     = "SELECT pg_catalog.pg_advisory_unlock_all()"
	// The identity of a connection at its first pin (see Acquire), and the
	// statement that restores, after RESET ALL, the settings the session
	// itself had set by then (source 'session': a SET in pgxpool's
	// AfterConnect, say), composed by the server (NULL where there are
	// none). Each value travels as the hex of its bytes in the database's
	// encoding (not converted: an SQL_ASCII database holds any), so that the
	// statement is ASCII whatever the value: PostgreSQL reads a reset's
	// text in the client_encoding the lent code may have left (SJIS, say),
	// in which a quoted non-ASCII value could read as other characters,
	// or as the end of its quote. The transaction_* settings are left out:
	// they belong to a transaction, and PostgreSQL refuses to set them once
	// a statement of it has run. Every name is pg_catalog's: the
	// connection's search_path may hold look-alikes.
	sqlIdentity = "SELECT session_user::pg_catalog.text, pg_catalog.current_setting('role'), " +
		"(SELECT 'SELECT ' OPERATOR(pg_catalog.||) pg_catalog.string_agg(pg_catalog.format(" +
		"'pg_catalog.set_config(%L, pg_catalog.convert_from(pg_catalog.decode(%L, ''hex''), %L), false)', " +
		"s.name, pg_catalog.encode(pg_catalog.convert_to(s.setting, pg_catalog.getdatabaseencoding()), 'hex'), pg_catalog.getdatabaseencoding()), ', ' ORDER BY s.name) " +
		"FROM pg_catalog.pg_settings s WHERE s.source OPERATOR(pg_catalog.=) 'session' " +
		"AND s.name OPERATOR(pg_catalog.<>) ALL ('{transaction_isolation,transaction_read_only,transaction_deferrable}'::pg_catalog.text[])), " +
		"pg_catalog.current_setting('lock_timeout')" // see Conn.SessionLockTimeout
	// The probe: a statement prepared once per connection (see Conn.Lend).
	// Executing it fails with SQLSTATE 26000 once something has
	// deallocated every prepared statement of the session, pgx's statement
	// cache included: the reset then fails and the connection is
	// destroyed. It runs first, before the whole reset: the lent code may
	// have prepared another statement under its name, and whatever that
	// does (a lock, a role, a setting) the reset after it undoes.
	probeName       = "pgxlock_reset"
	sqlPrepareProbe = "PREPARE " + probeName + " AS SELECT 1"
	sqlExecProbe    = "EXECUTE " + probeName
	sqlResetRest    = "CLOSE ALL; UNLISTEN *; RESET ALL; DISCARD TEMP; DISCARD SEQUENCES"
	resetSQL        = ResetSQL
)

// resetStatements are the statements of the reset one by one, for a
// caller's batch (QueueReset), which puts the probe before them on a
// connection that has one.
var resetStatements = [ResetStatements]string{
	"RESET SESSION AUTHORIZATION", "RESET ROLE", sqlUnlockAll,
	"CLOSE ALL", "UNLISTEN *", "RESET ALL", "DISCARD TEMP", "DISCARD SEQUENCES",
}

// stateKey is the key of a connection's *connState in pgconn's
// per-connection CustomData.
const stateKey = "pgxlock/pooltx"

// connState is what pooltx keeps for a connection across its pins: its
// baseline, recorded by its first pin (Acquire) or, with
// ConnOptions.DeferIdentity, its first Lend, and its socket's meter (see
// sent.go), made on first use. One entry, looked up once per pin (Conn.st),
// rather than one map lookup per use.
type connState struct {
	base  *baseline
	meter *meter
}

// state returns c's connState, made on first use.
func (c *Conn) state() *connState {
	if c.st != nil {
		return c.st
	}
	data := c.conn.PgConn().CustomData()
	st, _ := data[stateKey].(*connState)
	if st == nil {
		st = &connState{}
		data[stateKey] = st
	}
	c.st = st
	return st
}

// baseline is what a connection's first pin (or Lend) recorded: whether the
// reset's probe is prepared (not where the connection does not use pgx's
// statement cache: nothing to protect, pgx prepares no named statement
// there, and under PgBouncer in transaction mode a named statement would
// not follow the session), and the reset that returns the session to the
// identity it had then.
type baseline struct {
	probe       bool
	reset       string   // the probe (when prepared) and the reset, one simple-protocol string
	stmts       []string // the reset one by one, for QueueReset (the probe goes before them)
	lockTimeout string   // the session's lock_timeout then (Conn.SessionLockTimeout)
}

// defaultBaseline serves a connection with no baseline and no
// DeferIdentity, which Acquire does not hand out (its failed read destroys
// the connection): ResetSQL, naming no identity (RESET SESSION
// AUTHORIZATION, RESET ROLE).
var defaultBaseline = &baseline{reset: resetSQL, stmts: resetStatements[:]}

// sameIdentityBaseline serves a connection pinned with
// ConnOptions.DeferIdentity before any Lend recorded its identity: only
// the caller's own statements ran, which changed none, so the reset leaves
// identity as it is.
var sameIdentityBaseline = &baseline{reset: sqlUnlockAll + "; " + sqlResetRest, stmts: resetStatements[2:]}

// baseline returns c's recorded baseline, or nil before its first Lend.
func (c *Conn) baseline() *baseline { return c.state().base }

// base is c's baseline or, before one was recorded, the reset that keeps
// identity (ConnOptions.DeferIdentity) or names none.
func (c *Conn) base() *baseline {
	if b := c.baseline(); b != nil {
		return b
	}
	if c.deferIdentity {
		return sameIdentityBaseline
	}
	return defaultBaseline
}

// newBaseline returns the baseline of a connection whose session user was
// sessionUser and role role (current_setting('role'): "none" for none)
// when first lent; login is the user it authenticated as. restore, when
// not empty, is the statement that sets again the settings the session
// had set itself (see sqlIdentity); it runs last, so that none of them
// applies to the statements of the reset it ends (later resets run under
// them: see the package doc).
func newBaseline(probe, escape bool, login, sessionUser, role, restore string) *baseline {
	ident := asciiIdent
	if !escape {
		ident = func(name string) string { return pgx.Identifier{name}.Sanitize() }
	}
	b := &baseline{probe: probe, stmts: append([]string(nil), resetStatements[:]...)}
	if restore != "" {
		b.stmts = append(b.stmts, restore)
	}
	if sessionUser != login {
		b.stmts[0] = "SET SESSION AUTHORIZATION " + ident(sessionUser)
	}
	if role == "none" {
		b.stmts[1] = "SET ROLE NONE"
	} else {
		b.stmts[1] = "SET ROLE " + ident(role)
	}
	var sb strings.Builder
	if probe {
		sb.WriteString(sqlExecProbe + "; ")
	}
	for i, st := range b.stmts {
		if i > 0 {
			sb.WriteString("; ")
		}
		sb.WriteString(st)
	}
	b.reset = sb.String()
	return b
}

// asciiIdent quotes name, UTF-8, as an SQL identifier in ASCII alone: as
// pgx quotes it where it is ASCII, else as a Unicode-escaped identifier
// (U&"R\00F4le"), so that the reset reads the same whatever
// client_encoding the lent code left (PostgreSQL reads a statement's text
// in it: a non-ASCII name could read as other characters). It serves
// connections whose client_encoding was UTF8 when the name was read, on a
// server that is not SQL_ASCII (see readBaseline).
func asciiIdent(name string) string {
	ascii := true
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return pgx.Identifier{name}.Sanitize()
	}
	var sb strings.Builder
	sb.WriteString(`U&"`)
	for _, r := range name {
		switch {
		case r == '"':
			sb.WriteString(`""`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == 0:
			// PostgreSQL names hold no NUL (pgx's quoting drops it too).
		case r < 0x80:
			sb.WriteRune(r)
		case r <= 0xFFFF:
			fmt.Fprintf(&sb, `\%04X`, r)
		default:
			fmt.Fprintf(&sb, `\+%06X`, r)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

// Lend returns the connection for code the caller does not control (a
// callback, or statements of its caller's batch) and records that it was
// lent: from then on Release runs the whole reset, unless [Conn.Reclaim]
// finds that the code left the connection as it found it, and
// [Conn.MarkClean] must not be called. On a connection pinned with
// [ConnOptions.DeferIdentity], the first Lend (once in the connection's
// life: one round trip, bounded by the cleanup timeout, ctx unused) records
// the session's identity, session_user and role, as [Acquire] does
// otherwise, so that
// every later reset returns to that identity, one set in pgxpool's
// AfterConnect included, never to the authenticated user's (a first Lend
// inside a transaction of the caller's, where a SET LOCAL ROLE may be in
// force, records none and sends nothing: neither the identity in force
// then nor the one at connection start need be the pool's, so Release
// destroys the connection unless [Conn.Reclaim] found the lent code quiet
// since; a later Lend outside a transaction records it); on a
// connection whose pgx statement cache is in use it also prepares the
// reset's probe (as Acquire does), so that a DEALLOCATE ALL run by lent code
// is seen by the reset, which then destroys the connection instead of
// handing the next borrower a statement cache the server no longer has. A
// failure there closes the connection (a read cut short would leave its
// answer for the lent code to read) and marks c dirty: check [Conn.Dirty]
// before using what Lend returned. Lend also notes the socket's count of
// bytes written, for [Conn.Reclaim]: lent code that sent nothing needs no
// reset.
func (c *Conn) Lend(ctx context.Context) *pgx.Conn {
	_ = c.lend(true)
	return c.conn
}

// lend is Lend; mark false leaves the count for Reclaim unnoted (Tx notes
// it after its own BEGIN).
func (c *Conn) lend(mark bool) error {
	if c.lent {
		// Lent again, and not found quiet since: the counts of the Lend
		// that began the lending stand (or, where Reclaim found something
		// sent, none do), so the earlier code's statements are never
		// forgotten.
		c.clean = false
		return nil
	}
	c.lent = true
	c.wasLent = true
	c.clean = false
	c.marked = false
	if c.dirty != nil || c.conn.IsClosed() {
		return nil
	}
	if c.baseline() == nil {
		if err := c.recordBaseline(c.timeout); err != nil {
			return err
		}
	}
	if mark {
		c.markSent()
	}
	return nil
}

// recordBaseline reads c's identity, prepares the reset's probe where c
// uses pgx's statement cache, and records both; see Lend. It runs under
// the cleanup bound, not a context: a cancelled ctx must not close a
// connection that may hold the caller's lock.
func (c *Conn) recordBaseline(within time.Duration) error {
	done := false
	defer func() {
		if !done {
			// A panic of the pool's code while the answers were read (its
			// OnNotice): the rest of them is still on the way, as after a
			// read the bound cut. The panic goes on up.
			c.MarkDirty(errors.New("pooltx: the identity read panicked"))
			_ = c.conn.PgConn().Conn().Close()
		}
	}()
	err := c.readBaseline(within)
	done = true
	if err != nil {
		// A read the bound cut leaves its answer on the way (pgx keeps a
		// connection whose read timed out open): close the socket, so that
		// nothing later reads it as its own, and let Release destroy c.
		cerr := &CleanupError{Step: "prepare reset", Err: err}
		c.MarkDirty(cerr)
		_ = c.conn.PgConn().Conn().Close()
		return cerr
	}
	return nil
}

func (c *Conn) readBaseline(within time.Duration) error {
	cfg := c.conn.Config()
	probe := cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cfg.StatementCacheCapacity > 0
	st := c.state()
	if c.conn.PgConn().TxStatus() != 'I' {
		// Lent inside a transaction of the caller's (this package's own
		// lends come before BEGIN): a SET LOCAL ROLE may be in force, so
		// the identity read now need not be the session's, and the
		// identity at connection start need not be the pool's (a SET ROLE
		// in AfterConnect). Nothing is recorded: unless Reclaim finds the
		// lent code quiet, Release destroys the connection (see Lend).
		c.unknownIdentity = true
		return nil
	}
	sql, want := sqlIdentity, 1
	if probe {
		sql, want = sqlPrepareProbe+"; "+sqlIdentity, 2
	}
	var sessionUser, role, restore, lockTimeout string
	rows := 0
	n, err := c.execWithin(within, sql, func(v [][]byte) {
		rows++
		if len(v) == 4 && v[0] != nil && v[1] != nil && v[3] != nil {
			sessionUser, role, lockTimeout = string(v[0]), string(v[1]), string(v[3])
			if v[2] != nil {
				restore = string(v[2])
			}
		}
	})
	if err == nil && (n != want || rows != 1 || sessionUser == "" || role == "" || lockTimeout == "") {
		err = errors.New("the session's identity could not be read")
	}
	if err != nil {
		return err
	}
	// The names came in the connection's client_encoding: escaped as
	// Unicode only where that is UTF8 (as pgx asks unless the connection
	// string says otherwise) and the server can map code points (not
	// SQL_ASCII); elsewhere they are quoted as the bytes they are.
	pg := c.conn.PgConn()
	escape := strings.EqualFold(pg.ParameterStatus("client_encoding"), "UTF8") &&
		!strings.EqualFold(pg.ParameterStatus("server_encoding"), "SQL_ASCII")
	st.base = newBaseline(probe, escape, cfg.User, sessionUser, role, restore)
	st.base.lockTimeout = lockTimeout
	c.unknownIdentity = false // recorded now: an earlier lend inside a transaction was quiet
	return nil
}

// SessionLockTimeout returns the lock_timeout c's session had when its
// baseline was recorded (its first Lend, before the lent code ran: the
// value a SET in pgxpool's AfterConnect or PrepareConn, the connection
// string, the role, the database or the server gave it), which every reset
// returns it to; ok is false before a baseline was recorded. It serves a
// caller that sets lock_timeout with SET LOCAL for a wait and must set it
// back before lent code runs in the same transaction: SET LOCAL
// lock_timeout TO DEFAULT gives the reset value (connection string, role,
// database, server), not one the session SET itself.
func (c *Conn) SessionLockTimeout() (value string, ok bool) {
	if b := c.baseline(); b != nil {
		return b.lockTimeout, true
	}
	return "", false
}

// Lent reports whether c was handed to code its caller does not control
// ([Conn.Lend]). A connection never lent ran only its caller's own
// statements, which may be enough to put it back (see [Conn.MarkClean]).
func (c *Conn) Lent() bool { return c.lent }

// AppendReset appends to b the reset of c as one simple-protocol string of
// [Conn.ResetCount] statements (with the probe on a connection that has
// one: see [Conn.Lend]), for a caller that sends it after statements of
// its own in the same string and calls [Conn.MarkClean] once every
// statement has succeeded.
func (c *Conn) AppendReset(b []byte) []byte {
	return append(b, c.base().reset...)
}

// ResetCount is the number of statements, so of results, of the reset
// [Conn.AppendReset] appends for c: [ResetStatements] (two fewer, the
// identity's, on a connection pinned with [ConnOptions.DeferIdentity]
// whose identity no Lend has recorded yet), plus one for the
// probe on a connection that has one (see [Conn.Lend]), plus one for the
// settings the session had set itself when its baseline was recorded
// (see the package doc), where it had any.
func (c *Conn) ResetCount() int {
	b := c.base()
	if b.probe {
		return len(b.stmts) + 1
	}
	return len(b.stmts)
}

func (c *Conn) resetSQL() string { return c.base().reset }

// Reset returns the session of c to what a fresh connection of the pool
// has, in one round trip under ctx:
//
//   - identity: session_user and current_user as recorded by the
//     connection's first pin ([Acquire]) or, with
//     [ConnOptions.DeferIdentity], its first [Conn.Lend] (SET SESSION
//     AUTHORIZATION, then SET ROLE, naming them, by name; so a role that
//     pgxpool's AfterConnect set is restored, and the session never goes
//     back to the authenticated user's identity where it had left it);
//     with DeferIdentity and nothing recorded yet, left as it is (where
//     nothing could be recorded, a first Lend inside the caller's
//     transaction, Release destroys the connection all the same: see
//     [Conn.Lend]);
//   - every session-level advisory lock dropped (pg_advisory_unlock_all);
//   - every cursor closed (CLOSE ALL), every LISTEN ended (UNLISTEN *);
//   - every setting restored (RESET ALL, then the settings recorded with
//     the identity: see the package doc);
//   - temporary tables dropped (DISCARD TEMP);
//   - sequence state forgotten (DISCARD SEQUENCES: currval and lastval
//     are undefined again, as in a new session);
//   - on a connection that was lent and uses pgx's statement cache, a
//     check that the session's prepared statements were not deallocated
//     (see [Conn.Lend]).
//
// On success c counts as clean and Release returns it to the pool without a
// further round trip, provided nothing else runs on c in between. A failure
// marks c dirty and returns a *CleanupError with Step "reset". It must not
// run inside a transaction (a rollback would undo it).
//
// RESET ALL restores each setting to its value at connection start (the
// server's, database's and role's defaults and the connection string's
// RuntimeParams); a statement after it sets again the settings the
// session had set itself when its first pin (or Lend) recorded them, a
// SET run in pgxpool's AfterConnect say (see the package doc). What the
// reset does not undo is listed in the package documentation.
func (c *Conn) Reset(ctx context.Context) error {
	if n, err := execAll(ctx, c.conn.PgConn(), c.resetSQL()); err != nil || n != c.ResetCount() {
		if err == nil {
			err = errResetIncomplete
		}
		cerr := &CleanupError{Step: "reset", Err: err}
		c.MarkDirty(cerr)
		return cerr
	}
	c.clean = true
	return nil
}

// QueueReset adds the statements of [Conn.Reset] to b, for a caller whose
// own last statements (an unlock, say) go out in the same round trip. c
// counts as clean once b's results have been read without error; nothing
// else may run on c between b and Release. In pgx's statement-cache mode
// the statements run as pgx's cached prepared statements, which lent code
// can re-prepare as something else (see the package doc's list of what
// the reset does not undo); [Conn.AppendReset]'s simple-protocol string
// cannot be replaced so.
func (c *Conn) QueueReset(b *pgx.Batch) {
	base := c.base()
	if base.probe {
		b.Queue(sqlExecProbe)
	}
	for i, sql := range base.stmts {
		q := b.Queue(sql)
		if i == len(base.stmts)-1 {
			q.Exec(func(pgconn.CommandTag) error {
				c.clean = true
				return nil
			})
		}
	}
}

// MarkClean records that nothing run on c since it was acquired (or last
// reset) can have left a session-level lock or changed the session's
// state, for example a try-lock that was refused: Release then returns c
// to the pool without the reset. The caller vouches for every statement
// that ran; it must not be used once the connection was lent ([Conn.Lend])
// to code it does not control.
func (c *Conn) MarkClean() { c.clean = true }

// resetBounded runs the reset under the cleanup bound ([Conn.BoundCleanup])
// rather than a watched context, which costs pgx nothing. The
// Query message is written with pgconn's frontend and its answers read
// message by message (readAnswers), which allocates nothing per statement.
// A reset that fails or is cut short by the bound marks c dirty.
func (c *Conn) resetBounded() {
	n, err := c.ExecBounded(c.resetSQL(), nil)
	if err == nil && n != c.ResetCount() {
		err = errResetIncomplete
	}
	if err != nil {
		c.MarkDirty(&CleanupError{Step: "reset", Err: err})
		return
	}
	c.clean = true
}

// ExecBounded runs sql, one simple-protocol string of the caller's own
// statements (ending, say, with the reset: [Conn.AppendReset]), bounded by
// the cleanup timeout ([Conn.BoundCleanup]; no context is watched),
// and reads the answers message by message, with no allocation per
// statement. row, when not nil, is called with the values of each data row
// (valid during the call only). It returns how many statements completed
// and the first error; it marks c neither clean nor dirty.
func (c *Conn) ExecBounded(sql string, row func(values [][]byte)) (n int, err error) {
	return c.execWithin(c.timeout, sql, row)
}

// execWithin is ExecBounded bounded by d rather than the cleanup timeout.
func (c *Conn) execWithin(d time.Duration, sql string, row func(values [][]byte)) (n int, err error) {
	pg := c.conn.PgConn()
	c.bound.Start(pg.Conn(), d)
	defer c.EndBound()
	c.query.String = sql
	fe := pg.Frontend()
	fe.Send(&c.query)
	if err := fe.Flush(); err != nil {
		return 0, err
	}
	return readAnswers(pg, row)
}

// readAnswers reads the answers to one simple-protocol Query message on pg,
// up to its ReadyForQuery: the number of statements that completed and the
// first error. row, when not nil, is called with the values of each data
// row (valid during the call only). Notices and notifications go to pgconn's
// handlers as usual.
func readAnswers(pg *pgconn.PgConn, row func(values [][]byte)) (n int, err error) {
	return readAnswersCtx(context.Background(), pg, row, nil)
}

// readAnswersCtx is readAnswers under ctx (pgconn's context watcher: an
// ended ctx fails the read and, with pgx's default handler, closes the
// connection), calling done, when not nil, with each completed statement's
// index and command tag (valid during the call only).
func readAnswersCtx(ctx context.Context, pg *pgconn.PgConn, row func(values [][]byte), done func(i int, tag []byte)) (n int, err error) {
	for {
		msg, rerr := pg.ReceiveMessage(ctx)
		if rerr != nil {
			// ReceiveMessage marks every failure safe to retry; after a
			// write that may have reached the server, none is. Keep the
			// cause (a network error, ctx's error, a FATAL *PgError).
			if u := errors.Unwrap(rerr); u != nil {
				rerr = u
			}
			if err == nil {
				err = rerr
			}
			return n, err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if row != nil {
				row(m.Values)
			}
		case *pgproto3.CommandComplete:
			if done != nil {
				done(n, m.CommandTag)
			}
			n++
		case *pgproto3.ErrorResponse:
			if err == nil {
				err = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.ReadyForQuery:
			return n, err
		}
	}
}

// errResetIncomplete: fewer answers than statements came back.
var errResetIncomplete = errors.New("reset did not complete")

// errUnknownIdentity: a connection first lent inside the caller's
// transaction (see Lend) is destroyed at release.
var errUnknownIdentity = &CleanupError{Step: "reset", Err: errors.New("first lent inside a transaction: the session's identity to return to is unknown")}

// execAll runs sql (simple protocol, any number of statements) on pg and
// returns how many statements answered and the first error.
func execAll(ctx context.Context, pg *pgconn.PgConn, sql string) (n int, err error) {
	mrr := pg.Exec(ctx, sql)
	for mrr.NextResult() {
		if _, rerr := mrr.ResultReader().Close(); rerr != nil && err == nil {
			err = rerr
		}
		n++
	}
	if cerr := mrr.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}
