package advisory

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// enders are statements that end (or begin) a transaction, each refused
// in every mode; savepoints are statements that stay in it, refused in
// none.
var (
	enders = []string{
		"COMMIT", "commit", "END", "end transaction", "END WORK", "ROLLBACK", "rollback and chain",
		"ROLLBACK WORK", "ROLLBACK TRANSACTION", "COMMIT AND CHAIN", "COMMIT AND NO CHAIN", "ABORT",
		"abort work", "BEGIN", "begin isolation level serializable", "START TRANSACTION",
		"PREPARE TRANSACTION 'x'", "COMMIT PREPARED 'x'", "ROLLBACK PREPARED 'x'",
		"  -- a comment\n commit", "/* a /* nested */ one */ END", "-- x\rCOMMIT", "--\rEND",
		"-- x\rROLLBACK", "-- x\r\nCOMMIT", "\vCOMMIT", "\fCOMMIT", "ROLLBACK -- x\rAND CHAIN",
		"ROLLBACK/* TO */", "; COMMIT", ";BEGIN", "; /* ; */ ;\n;END;",
	}
	savepoints = []string{
		"SAVEPOINT s", "savepoint s", "ROLLBACK TO SAVEPOINT s", "rollback to s", "ROLLBACK WORK TO s",
		"ROLLBACK TRANSACTION TO SAVEPOINT s", "ROLLBACK WORK TO SAVEPOINT s", "ROLLBACK TRANSACTION TO s",
		"ROLLBACK/* c */TO s", "ROLLBACK -- c\rTO s", "rollback\r\nwork\tto\fsavepoint s",
		"RELEASE SAVEPOINT s", "RELEASE s",
	}
)

func TestBatchCheckRefusesEndersInEveryMode(t *testing.T) {
	for _, simple := range []bool{false, true} {
		for _, sql := range enders {
			if refusal(sql, 0, simple) == "" {
				t.Errorf("simple=%v: %q not refused", simple, sql)
			}
		}
		for _, sql := range savepoints {
			if r := refusal(sql, 0, simple); r != "" {
				t.Errorf("simple=%v: savepoint statement %q refused: %s", simple, sql, r)
			}
		}
	}
}

// The cases of issue 20 part 1 in the simple protocol, and what a lexer of
// PostgreSQL's rules reads there.
func TestBatchCheckSimpleProtocol(t *testing.T) {
	refused := []string{
		"SELECT name'\\'; COMMIT; --'",               // name'...' is no E'' string
		"SELECT 1 AS x$a$; COMMIT; SELECT 1 AS y$a$", // x$a$ is an identifier
		"SELECT 1; -- x\rCOMMIT",
		"SELECT 1; -- x\r; COMMIT",
		"INSERT INTO t VALUES (1); COMMIT",
		"SELECT '\\'; COMMIT",
		"SELECT 'a;b'; commit",
		"SELECT $$ ; $$ ; END",
		"SELECT $tag$ ;commit $tag$; rollback",
		"SELECT E'\\' ; commit'; SELECT 1; COMMIT",
		"SELECT \"a;\"\"b\" FROM t; begin",
		"SELECT E'a'\n'\\''; COMMIT; SELECT ''", // an E'' string continued on the next line keeps its escapes
		"SELECT E'a' -- c\n'\\''; COMMIT; SELECT ''",
		"SELECT E'a' -- c\n'\\''; COMMIT; --'", // the newline ending the comment starts the continuation
		"SELECT E'a' -- c\r'\\''; COMMIT; --'",
		"SELECT E'a'\r\n\v -- c\n\n'\\''; COMMIT; --'",
		"SELECT U&'\\'; COMMIT; --'",
		// Left open: would go on into the next entry.
		"SELECT $a$", "SELECT 'x", "SELECT E'x\\'", "SELECT \"x", "/* x", "/* /* */",
		// Read differently by versions of PostgreSQL.
		"SELECT 1e'\\'; COMMIT; --'", "SELECT 1_000$a$; COMMIT; $a$", "SELECT 0x1F", "SELECT $1abc",
		// Over-refused: END after a semicolon inside BEGIN ATOMIC.
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
	}
	for _, sql := range refused {
		if simpleRefusal(sql, 0) == "" {
			t.Errorf("%q not refused", sql)
		}
	}
	fine := []string{
		"",
		"SELECT 'commit'",
		"SELECT 1 -- ; commit",
		"SELECT 1 -- ; commit\n",
		"SELECT 1 /* ; commit */",
		"SELECT 1 /* /* */ ; commit */",
		"SELECT $$; COMMIT$$",
		"SELECT $q$; COMMIT$q$",
		"SELECT $q$ $a$; COMMIT $q$",
		"SELECT 'it''s; commit'",
		"SELECT E'it\\'s; commit'",
		"SELECT \"commit\" FROM t",
		"SELECT endpoint FROM commits",
		"UPDATE t SET v = 'BEGIN'",
		"SELECT E'a' '\\''; COMMIT; SELECT '", // no newline: no continuation, a new '' string
		"SELECT 'a'\n'\\''; COMMIT; SELECT '", // a '' string continued stays one
		"SELECT 1e5, 1.5E-3, .5, 1.",
		"SELECT x$a$y FROM t",
		"SELECT 1$a$; COMMIT; SELECT $a$", // 1 then a dollar quote (which the grammar fails)
		"SELECT 1; SELECT 2",
		"SAVEPOINT s; ROLLBACK TO s; RELEASE s",
		"PREPARE q AS SELECT 1",
		"DO $$BEGIN COMMIT; END$$",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$SELECT 1; $$",
	}
	for _, sql := range fine {
		if r := simpleRefusal(sql, 0); r != "" {
			t.Errorf("%q refused: %s", sql, r)
		}
	}

	withArgs := map[string]bool{ // refused, with one argument?
		"INSERT INTO t VALUES ($1)":  false,
		"SELECT $1::int; SELECT $1":  false,
		"SELECT $1::int; SELECT $2":  true, // pgx: insufficient arguments
		"SELECT 1":                   true, // pgx: unused argument
		"SELECT $0":                  true,
		"SELECT 'a', $1":             false,
		"SELECT '$1', $1":            true,
		"SELECT $1 /* $1 */":         true,
		"SELECT $1 -- $1":            true,
		"SELECT $$ $1 $$, $1":        true,
		"SELECT \"$1\", $1":          true,
		"SELECT x$1":                 true,
		"SELECT E'x'\n$1":            true,
		"SELECT 'x' -- c\n$1":        true,
		"SELECT 'x' /* c */ $1":      false,
		"SELECT name'$1', $1":        true,
		"SELECT 1 AS x$a$, $1, $a$a": true,
	}
	for sql, want := range withArgs {
		if got := simpleRefusal(sql, 1) != ""; got != want {
			t.Errorf("%q with arguments: refused %v, want %v", sql, got, want)
		}
	}
	if r := simpleRefusal("SELECT $2, $1, $2", 2); r != "" {
		t.Errorf("two arguments refused: %s", r)
	}
	for _, sql := range []string{"SELECT $1", "SELECT $1 -- c\n; COMMIT"} {
		if simpleRefusal(sql, 0) == "" {
			t.Errorf("%q without arguments not refused", sql)
		}
	}
	if r := simpleRefusal("SELECT 'costs $1'", 0); r != "" {
		t.Errorf("a $1 in a literal, no arguments, refused: %s", r)
	}
}

// The extended protocol sends each string in a Parse of its own, one
// statement at most: only its leading keywords count.
func TestBatchCheckExtendedProtocolReadsTheLeadingKeyword(t *testing.T) {
	for _, sql := range []string{
		"SELECT 1; COMMIT", // refused by the server: see TestBatchCheckAgreesWithServer
		"SELECT name'\\'; COMMIT; --'",
		"SELECT '$1', $1",
		"SELECT 1e5",
		"SELECT $a$",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
	} {
		if r := refusal(sql, 1, false); r != "" {
			t.Errorf("%q refused: %s", sql, r)
		}
	}
	// What no statement starts with: maybe a prepared statement's name.
	for _, sql := range []string{"finish", "\"COMMIT\"", "x$1", "@x", "1", "'COMMIT'", "-- c\rfinish", ";finish"} {
		if refusal(sql, 0, false) == "" {
			t.Errorf("%q not refused", sql)
		}
	}
	for _, sql := range []string{"(SELECT 1)", " -- only a comment", ";", "WITH x AS (SELECT 1) SELECT 1",
		"VALUES (1)", "TABLE t", "explain SELECT 1", "; -- c\r\n; /* */ select 1", "ANALYSE t"} {
		if r := refusal(sql, 0, false); r != "" {
			t.Errorf("%q refused: %s", sql, r)
		}
	}
}

// QueryRewriters are applied before the check, as pgx applies them.
func TestBatchCheckAppliesQueryRewriters(t *testing.T) {
	for _, mode := range execModes {
		c := connInMode(t, mode)
		b := &pgx.Batch{}
		b.Queue("SELECT @v::text", pgx.NamedArgs{"v": "x"})
		b.Queue("ignored", rewriteTo("COMMIT"))
		if _, i, why, found := checkBatch(context.Background(), c, b); !found || i != 1 {
			t.Errorf("%v: rewritten COMMIT not refused: %d %q %v", mode, i, why, found)
		}
		b = &pgx.Batch{}
		b.Queue("SELECT @v::text /* $1 */", pgx.NamedArgs{"v": "x"}) // in the simple protocol: $1 in a comment, with arguments
		if _, _, _, found := checkBatch(context.Background(), c, b); found != (mode == pgx.QueryExecModeSimpleProtocol) {
			t.Errorf("%v: rewritten string: refused %v", mode, found)
		}
	}
}

type rewriteTo string

func (r rewriteTo) RewriteQuery(context.Context, *pgx.Conn, string, []any) (string, []any, error) {
	return string(r), nil, nil
}

// connInMode is a connection to the test database in mode.
func connInMode(t *testing.T, mode pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	cfg := pgtest.Config(t).ConnConfig.Copy()
	cfg.DefaultQueryExecMode = mode
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// onServer leaves out the statements a test server must not run for real
// (PREPARE TRANSACTION would leave a prepared transaction behind where
// max_prepared_transactions > 0).
func onServer(stmts []string) []string {
	var out []string
	for _, s := range stmts {
		if !strings.Contains(s, "PREPARE") {
			out = append(out, s)
		}
	}
	return out
}

var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// entry is one queued string of a candidate batch.
type entry struct {
	sql  string
	args []any
}

// sandbox runs candidate batches inside a transaction of a connection of
// its own, in one exec mode, and tells whether that transaction survived.
type sandbox struct {
	t        testing.TB
	cfg      *pgx.ConnConfig
	conn     *pgx.Conn
	observer *pgx.Conn
	begun    atomic.Bool // a BEGIN ran inside the transaction (25001)
}

func newSandbox(t testing.TB, mode pgx.QueryExecMode) *sandbox {
	t.Helper()
	sb := &sandbox{t: t}
	base := pgtest.Config(t).ConnConfig
	sb.cfg = base.Copy()
	sb.cfg.DefaultQueryExecMode = mode
	sb.cfg.RuntimeParams["statement_timeout"] = "10s" // a safety net: no candidate waits
	sb.cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Code == "25001" { // there is already a transaction in progress
			sb.begun.Store(true)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if sb.observer, err = pgx.ConnectConfig(ctx, base.Copy()); err != nil {
		t.Fatal(err)
	}
	sb.connect(ctx)
	t.Cleanup(func() {
		_ = sb.observer.Close(context.Background())
		_ = sb.conn.Close(context.Background())
	})
	return sb
}

func (sb *sandbox) connect(ctx context.Context) {
	if sb.conn != nil {
		_ = sb.conn.Close(ctx)
	}
	var err error
	if sb.conn, err = pgx.ConnectConfig(ctx, sb.cfg); err != nil {
		sb.t.Fatal(err)
	}
	// A procedure that commits, for CALL candidates.
	if _, err = sb.conn.Exec(ctx, "CREATE PROCEDURE pg_temp.commits() LANGUAGE plpgsql AS $$BEGIN COMMIT; END$$"); err != nil {
		sb.t.Fatal(err)
	}
}

// ends runs entries as one pgx batch inside a transaction of the sandbox
// and reports whether a statement of them ended that transaction or began
// one, as the server tells: its xid committed (pg_xact_status, read from
// another session); the session out of any transaction block, or in a
// block that is not the xid's; a command tag of transaction control
// (COMMIT, BEGIN, START TRANSACTION, PREPARE TRANSACTION, COMMIT or
// ROLLBACK PREPARED; ROLLBACK, which ROLLBACK TO shares, when the xid is no
// longer in progress and no RELEASE ran); or the warning a BEGIN inside a
// transaction block gives. The transaction is then rolled back.
//
// An error in a transaction block aborts its xid while the block stays
// open (the session then answers "in failed transaction"): that is no end,
// as nothing more runs in it.
func (sb *sandbox) ends(entries []entry) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if sb.conn.IsClosed() {
		sb.connect(ctx)
	}
	var xid string
	if _, err := sb.conn.Exec(ctx, "BEGIN"); err != nil {
		sb.t.Fatal(err)
	}
	if err := sb.conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&xid); err != nil {
		sb.t.Fatal(err)
	}
	sb.begun.Store(false)
	b := &pgx.Batch{}
	for _, e := range entries {
		b.Queue(e.sql, e.args...)
	}
	var trace bytes.Buffer
	sb.conn.PgConn().Frontend().Trace(&trace, pgproto3.TracerOptions{SuppressTimestamps: true})
	_ = sb.conn.SendBatch(ctx, b).Close()
	sb.conn.PgConn().Frontend().Untrace()
	txStatus := sb.conn.PgConn().TxStatus()
	closed := sb.conn.IsClosed()
	var status string
	if err := sb.observer.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&status); err != nil {
		sb.t.Fatal(err)
	}
	tags := map[string]bool{}
	for _, line := range strings.Split(trace.String(), "\n") {
		if i := strings.Index(line, "CommandComplete"); i >= 0 {
			if q := strings.Index(line[i:], "\""); q >= 0 {
				tags[strings.Trim(line[i+q:], "\"")] = true
			}
		}
	}
	ended := status == "committed" || sb.begun.Load() ||
		!closed && (txStatus == 'I' || txStatus == 'T' && status != "in progress") ||
		tags["COMMIT"] || tags["BEGIN"] || tags["START TRANSACTION"] || tags["PREPARE TRANSACTION"] ||
		tags["COMMIT PREPARED"] || tags["ROLLBACK PREPARED"] ||
		tags["ROLLBACK"] && status != "in progress" && !tags["RELEASE"]
	if closed {
		sb.connect(ctx)
	} else if _, err := sb.conn.Exec(ctx, "ROLLBACK"); err != nil {
		sb.connect(ctx)
	}
	return ended
}

// refused applies WithXactLockBatch's check to entries in mode.
func refused(entries []entry, mode pgx.QueryExecMode) string {
	for i, e := range entries {
		if r := refusal(e.sql, len(e.args), mode == pgx.QueryExecModeSimpleProtocol); r != "" {
			return fmt.Sprintf("entry %d: %s", i, r)
		}
	}
	return ""
}

// Pieces of candidates: what may open or close a literal, a comment or a
// dollar quote in one lexer and not in another, statements that end the
// transaction, and separators.
var (
	openers = []string{
		"SELECT name'\\'", "SELECT 1 AS x$a$", "SELECT E'\\'", "SELECT e'\\'", "SELECT '\\'", "SELECT $a$",
		"SELECT $$", "SELECT \"", "/*", "/* /* */", "-- x", "SELECT 1e'\\'", "SELECT U&'\\'", "SELECT N'\\'",
		"SELECT E'a'\n'\\'", "SELECT E'a' -- c\r'\\'", "SELECT E'a'\v\n'\\'", "SELECT E'a' '\\'",
		"SELECT 'a'\nE'\\'", "SELECT $1", "SELECT 'x' || $1", "SELECT 1 AS x$", "SELECT 1$a$", "SELECT",
		"SELECT x$a$y", "SELECT B'1'\n'", "SELECT $_$",
	}
	closers = []string{
		"'", "--'", "SELECT 1 AS y$a$", "$a$", "SELECT $a$", "$$", "\"", "*/", "*/ */", "", "-- '", "$_$",
		"SELECT '", "SELECT $1", "SELECT ''",
	}
	middles = append([]string{
		"DO $$BEGIN COMMIT; END$$", "DO $d$BEGIN ROLLBACK; END$d$", "CALL pg_temp.commits()",
		"SELECT 1", "SAVEPOINT s", "ROLLBACK TO s",
	}, onServer(enders)...)
	separators = []string{";", "; ", "\n;", ";\n", ";\r", " ; ", ";--\r", ";/**/"}
	noise      = []string{"", " ", "\n", "\r", "\r\n", "\f", "\v", "\t", "-- n\n", "-- n\r", "/* n */", "/* /* n */ */"}
	// pairs hide what lies between them from one lexer or another, as
	// valid SQL.
	pairs = [][2]string{
		{"SELECT name'\\'", "--'"}, {"SELECT 1 AS x$a$", "SELECT 1 AS y$a$"}, {"SELECT E'\\'", "'"},
		{"SELECT '\\'", "SELECT ''"}, {"SELECT $a$", "$a$"}, {"SELECT 1 -- x\r", ""}, {"/* /* */", "*/"},
		{"SELECT E'a'\n'\\'", "'"}, {"SELECT E'a' '\\'", "SELECT ''"}, {"SELECT U&'\\'", "--'"},
		{"SELECT 'a''", "'"}, {"SELECT \"a\"\"", "\""}, {"SELECT $A$", "$a$"}, {"SELECT $a$ $", "a$"},
		{"/*/*/", "*/"}, {"/**/ /*", "*/"}, {"SELECT 1 -- x\f", ""}, {"SELECT 1 -- x\v", ""},
		{"SELECT \"\\\"", "--\""}, {"SELECT E'a' -- c\n'\\''", "--'"}, {"SELECT E'a'\n'\\''", "--'"}, {"SELECT x$a$", "$a$"}, {"SELECT $a$ $b$", "$a$"}, {"SELECT 'a'\r'\\'", "SELECT ''"},
	}
	argValues = []any{
		"'; COMMIT; --", "\\'; COMMIT; --", "$$; COMMIT; $$", "*/; COMMIT; /*", "$a$; COMMIT; $a$", "\n;COMMIT;\n", -1, 1,
	}
)

// candidate builds a batch from r: an opener, a statement between
// separators, a closer, noise, cut into one to three entries at random
// places; an entry holding "$1" gets an argument.
func candidate(r *rand.Rand) []entry {
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	var sql string
	switch r.IntN(4) {
	case 0: // random pieces
		var sb strings.Builder
		all := [][]string{openers, closers, middles, separators, noise}
		for range 2 + r.IntN(6) {
			sb.WriteString(pick(all[r.IntN(len(all))]))
		}
		sql = sb.String()
	case 1: // a pair around a statement
		p := pairs[r.IntN(len(pairs))]
		sql = p[0] + pick(noise) + pick(separators) + pick(middles) + pick(separators) + pick(noise) + p[1]
	default:
		sql = pick(noise) + pick(openers) + pick(noise) + pick(separators) + pick(noise) + pick(middles) +
			pick(noise) + pick(separators) + pick(noise) + pick(closers) + pick(noise)
	}
	// Cut anywhere, or after a semicolon, where a statement may start.
	var semis []int
	for i := range len(sql) {
		if sql[i] == ';' {
			semis = append(semis, i+1)
		}
	}
	cuts := []int{}
	for range r.IntN(3) {
		if len(semis) > 0 && r.IntN(2) == 0 {
			cuts = append(cuts, semis[r.IntN(len(semis))])
		} else {
			cuts = append(cuts, r.IntN(len(sql)+1))
		}
	}
	slices.Sort(cuts)
	var entries []entry
	start := 0
	for _, c := range append(cuts, len(sql)) {
		if c <= start {
			continue // an empty string is refused (see checkBatch)
		}
		entries = append(entries, entry{sql: sql[start:c]})
		start = c
	}
	for i := range entries {
		if strings.Contains(entries[i].sql, "$1") {
			entries[i].args = []any{argValues[r.IntN(len(argValues))]}
		}
	}
	return entries
}

// checkAgainstServer runs entries in sb and fails t when the transaction
// ended and the check did not refuse the batch.
func checkAgainstServer(t testing.TB, sb *sandbox, mode pgx.QueryExecMode, entries []entry) (ended bool) {
	t.Helper()
	ended = sb.ends(entries)
	if ended && refused(entries, mode) == "" {
		t.Errorf("%v: the transaction ended and the check let it through: %#v", mode, entries)
	}
	return ended
}

// The check is differential against the server: every candidate batch
// that ends its transaction on PostgreSQL, in any exec mode, is refused. A
// bounded deterministic run; FuzzBatchCheckAgreesWithServer is the open
// one.
func TestBatchCheckAgreesWithServer(t *testing.T) {
	sbs := make([]*sandbox, len(execModes))
	for i, m := range execModes {
		sbs[i] = newSandbox(t, m)
	}
	// What the check relies on, seen on the server: a Parse of several
	// statements fails; transaction control in a DO block or a procedure
	// called inside a transaction block fails; none of them ends it.
	for i, m := range execModes[:4] {
		for _, sql := range []string{"SELECT 1; COMMIT", "SELECT 1;COMMIT;", "DO $$BEGIN COMMIT; END$$",
			"CALL pg_temp.commits()", "VACUUM", "CREATE DATABASE pgxlock_never"} {
			if sbs[i].ends([]entry{{sql: sql}}) {
				t.Errorf("%v: %q ended the transaction", m, sql)
			}
		}
	}
	// In the simple protocol the whole text is parsed before any of it
	// runs: a statement the grammar fails stops those before it too.
	if sbs[4].ends([]entry{{sql: "COMMIT; SELECT ("}}) || sbs[4].ends([]entry{{sql: "COMMIT"}, {sql: "SELECT ("}}) {
		t.Error("simple protocol: a COMMIT before a syntax error ran")
	}
	for _, sql := range []string{"DO $$BEGIN COMMIT; END$$", "CALL pg_temp.commits()", "VACUUM", "CREATE DATABASE pgxlock_never"} {
		if sbs[4].ends([]entry{{sql: sql}}) {
			t.Errorf("simple protocol: %q ended the transaction", sql)
		}
	}
	// pgx's own lexer reads name'...' as an E'...' string: an argument
	// it substitutes where PostgreSQL reads a literal can close that
	// literal, and a COMMIT in the argument runs.
	inject := []entry{{sql: "SELECT name'\\' AS a, ' $1 ' AS b", args: []any{"'; COMMIT; --"}}}
	t.Logf("pgx's substitution into a literal ends the transaction: %v", checkAgainstServer(t, sbs[4], execModes[4], inject))
	for i, m := range execModes {
		for _, sql := range savepoints {
			es := []entry{{sql: "SAVEPOINT s"}, {sql: sql}}
			if sbs[i].ends(es) {
				t.Errorf("%v: %q ended the transaction", m, sql)
			}
			if r := refused(es, m); r != "" {
				t.Errorf("%v: %q refused: %s", m, sql, r)
			}
		}
		for _, sql := range onServer(enders) {
			checkAgainstServer(t, sbs[i], m, []entry{{sql: sql}})
		}
	}
	r := rand.New(rand.NewPCG(20, 1))
	n, ended := 400, 0
	if testing.Short() {
		n = 50
	}
	for i := range n {
		es := candidate(r)
		// Each candidate in the simple protocol and in one extended mode.
		if checkAgainstServer(t, sbs[4], execModes[4], es) {
			ended++
		}
		if checkAgainstServer(t, sbs[i%4], execModes[i%4], es) {
			ended++
		}
	}
	t.Logf("%d candidates, %d runs ended their transaction (and were refused)", n, ended)
	if ended == 0 {
		t.Error("no candidate ended its transaction: the generator finds nothing")
	}
}

// FuzzBatchCheckAgreesWithServer: sql cut at two places into up to three
// entries, with arg as the argument of every entry holding "$1", run in
// mode (mod 5): when the transaction ends, the check must have refused it.
func FuzzBatchCheckAgreesWithServer(f *testing.F) {
	for _, s := range []string{
		"SELECT name'\\'; COMMIT; --'", "SELECT 1 AS x$a$; COMMIT; SELECT 1 AS y$a$",
		"-- x\rCOMMIT", "--\rEND", "-- x\rROLLBACK", "SELECT E'a'\n'\\''; COMMIT; SELECT ''",
		"SELECT $a$ ; COMMIT; SELECT $a$", "SELECT $$ $1 $$; COMMIT", "SELECT 1; COMMIT",
	} {
		for mode := range uint8(5) {
			f.Add(s, uint16(0), uint16(0), mode, "")
		}
	}
	// Entries "SELECT $a$", "COMMIT", "SELECT $a$": one dollar quote once joined.
	f.Add("SELECT $a$COMMITSELECT $a$", uint16(10), uint16(16), uint8(4), "")
	f.Add("SELECT '$1'; SELECT $1", uint16(0), uint16(0), uint8(4), "'; COMMIT; --")
	f.Add("SELECT $$ $1 $$, $1", uint16(0), uint16(0), uint8(4), "$$; COMMIT; $$")
	sbs := make([]*sandbox, len(execModes))
	for i, m := range execModes {
		sbs[i] = newSandbox(f, m)
	}
	f.Fuzz(func(t *testing.T, sql string, cut1, cut2 uint16, mode uint8, arg string) {
		m := execModes[int(mode)%len(execModes)]
		sb := sbs[int(mode)%len(execModes)]
		a, b := min(int(cut1), len(sql)), min(int(cut2), len(sql))
		if a > b {
			a, b = b, a
		}
		var es []entry
		for _, s := range []string{sql[:a], sql[a:b], sql[b:]} {
			if s == "" {
				continue // refused (see checkBatch)
			}
			e := entry{sql: s}
			if strings.Contains(s, "$1") {
				e.args = []any{arg}
			}
			es = append(es, e)
		}
		sb.t = t
		checkAgainstServer(t, sb, m, es)
	})
}
