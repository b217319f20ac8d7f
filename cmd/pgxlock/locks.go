package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
)

const locksSynopsis = "pgxlock locks [--key K]... [--watch [--interval 1s]] [--json] [--show-query] [--ns NAME=ID]..."

// locksOptions are the flags of `pgxlock locks`.
type locksOptions struct {
	filter    []keys.Key
	watch     bool
	interval  time.Duration
	json      bool
	showQuery bool
}

func cmdLocks(ctx context.Context, args []string, s stdio, e env) int {
	ns := namespaces{}
	if err := ns.addList(e.get(envNamespaces)); err != nil {
		return usageError(s, "locks", "%s: %v", envNamespaces, err)
	}
	var (
		o       locksOptions
		keyArgs keyList
	)
	fs := newFlagSet("locks", locksSynopsis, s.Err)
	fs.Var(&keyArgs, "key", "show only locks on key `K` (repeatable; see the key syntax)")
	fs.BoolVar(&o.watch, "watch", false, "redraw every --interval until interrupted (SIGINT)")
	fs.DurationVar(&o.interval, "interval", time.Second, "redraw interval for --watch")
	fs.BoolVar(&o.json, "json", false, "print JSON (one document per line with --watch)")
	fs.BoolVar(&o.showQuery, "show-query", false, "also show each backend's current or last query (may contain literal values)")
	fs.Var(nsFlag{ns}, "ns", "name a namespace: `NAME=ID` (repeatable)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(s, "locks", "unexpected argument %q", fs.Arg(0))
	}
	if o.interval <= 0 {
		return usageError(s, "locks", "--interval must be positive")
	}
	for _, a := range keyArgs {
		k, hashed, err := ns.parseKey(a)
		if err != nil {
			return usageError(s, "locks", "--key: %v", err)
		}
		if hashed {
			fmt.Fprint(s.Err, hashNote("locks", k))
		}
		o.filter = append(o.filter, k)
	}

	if !o.watch {
		conn, err := connect(ctx, e)
		if err != nil {
			s.msgf(s.Err, "pgxlock locks: %v\n", err)
			return connFailed(err)
		}
		defer closeConn(ctx, conn)
		snap, err := takeSnapshot(ctx, conn, o.filter)
		if err != nil {
			s.msgf(s.Err, "pgxlock locks: %v\n", err)
			return exitUnavailable
		}
		if err := writeSnapshot(s.Out, snap, o); err != nil {
			s.msgf(s.Err, "pgxlock locks: %v\n", err)
			return exitError
		}
		return exitOK
	}
	// Settings that cannot be parsed are a usage error, not something
	// --watch should retry every interval.
	if _, err := connConfig(e); err != nil {
		s.msgf(s.Err, "pgxlock locks: %v\n", err)
		return connFailed(err)
	}
	return watchLocks(ctx, s, e, o)
}

// watchLocks redraws the snapshot every interval until ctx ends or SIGINT or
// SIGTERM arrives, which is a normal end (exit 0). A failed snapshot is
// reported in place of the table and the connection is opened again at the
// next tick: a watch is most useful while the database is in trouble.
func watchLocks(ctx context.Context, s stdio, e env, o locksOptions) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	clear := isTerminal(s.Out) && !o.json
	// Each frame is drawn into frame, then handed to out, which writes it on
	// a goroutine of its own: a stdout nobody reads holds back neither the
	// next tick nor the exit a signal asks for (frames that do not fit its
	// queue are dropped).
	out, errs := newNotes(s.Out), newNotes(s.Err)
	defer out.close()
	defer errs.close()
	s.Err = errs
	var frame bytes.Buffer
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(ctx, conn)
		}
	}()
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		var err error
		if conn == nil {
			conn, err = connect(ctx, e)
		}
		var snap snapshot
		if err == nil {
			snap, err = takeSnapshot(ctx, conn, o.filter)
			if err != nil && conn.IsClosed() {
				conn = nil
			}
		}
		if ctx.Err() != nil {
			return exitOK
		}
		frame.Reset()
		if clear {
			frame.WriteString("\x1b[H\x1b[2J")
		}
		switch {
		case err != nil && o.json:
			s.msgf(s.Err, "pgxlock locks: %s: %v\n", time.Now().Format(time.RFC3339), err)
		case err != nil:
			s.msgf(&frame, "%s  error: %v (retrying every %s)\n\n", time.Now().Format(time.RFC3339), err, o.interval)
		default:
			if !o.json {
				s.msgf(&frame, "%s  database %s  every %s (Ctrl-C to stop)\n", snap.At.Format(time.RFC3339), snap.Database, o.interval)
			}
			if werr := writeSnapshot(&frame, snap, o); werr != nil {
				s.msgf(s.Err, "pgxlock locks: %v\n", werr)
				return exitError
			}
			if !o.json && !clear {
				frame.WriteByte('\n')
			}
		}
		if frame.Len() > 0 {
			_, _ = out.Write(frame.Bytes())
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
	}
}

// snapshot is one listing: the locks and the server's clock when it was
// taken, against which durations are computed (never the local clock, which
// may disagree with the server's).
type snapshot struct {
	At       time.Time
	Database string
	Locks    []advisory.LockInfo
}

func takeSnapshot(ctx context.Context, conn *pgx.Conn, filter []keys.Key) (snapshot, error) {
	var snap snapshot
	locks, err := advisory.ListLocks(ctx, conn, filter...)
	if err != nil {
		return snap, err
	}
	var us int64
	if err := conn.QueryRow(ctx, "SELECT "+clockMicrosSQL+", pg_catalog.current_database()").Scan(&us, &snap.Database); err != nil {
		return snap, fmt.Errorf("read the server clock: %w", err)
	}
	snap.At = time.UnixMicro(us)
	snap.Locks = locks
	return snap, nil
}

func writeSnapshot(w io.Writer, snap snapshot, o locksOptions) error {
	if o.json {
		return writeLocksJSON(w, snap, o.showQuery)
	}
	return writeLocksText(w, snap, o.showQuery)
}

// holdBounds estimates how long a granted lock has been held. PostgreSQL
// does not record when an advisory lock was granted, so this is a range:
//
//   - at most the session's age (now - backend_start): no session holds a
//     lock from before it began;
//   - at least the time since an idle session's last state change: an idle
//     session runs nothing, so the statement that took the lock ended by then.
//     An active session may be taking it in its current statement: no lower
//     bound (ok false).
//
// A client that pings its idle connection (the library's lock watcher does,
// every heartbeat) resets state_change each time, so the lower bound can be
// far below the real hold time: it is a bound, not an estimate.
func holdBounds(li advisory.LockInfo, now time.Time) (lower time.Duration, lowerOK bool, upper time.Duration, upperOK bool) {
	if !li.BackendStart.IsZero() {
		upper, upperOK = nonNegative(now.Sub(li.BackendStart)), true
	}
	switch li.State {
	case "idle", "idle in transaction", "idle in transaction (aborted)":
		if !li.StateChange.IsZero() {
			lower, lowerOK = nonNegative(now.Sub(li.StateChange)), true
		}
	}
	return
}

// waited is how long a waiter has waited (pg_locks.waitstart, which the
// server sets shortly after the wait begins: ok false until then).
func waited(li advisory.LockInfo, now time.Time) (time.Duration, bool) {
	if li.Granted || li.WaitStart.IsZero() {
		return 0, false
	}
	return nonNegative(now.Sub(li.WaitStart)), true
}

func nonNegative(d time.Duration) time.Duration { return max(d, 0) }

func modeName(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusive"
}

// locksFootnote explains the FOR column; it is part of the text output.
const locksFootnote = `FOR: waiters: time since the wait began (pg_locks.waitstart). Holders: a range, since
PostgreSQL does not record when an advisory lock was granted: >= time since an idle session's
last statement ended (heartbeats reset it), <= the session's age.`

func writeLocksText(w io.Writer, snap snapshot, showQuery bool) error {
	if len(snap.Locks) == 0 {
		_, err := fmt.Fprintln(w, "no advisory locks held or awaited")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "KEY\tMODE\tSTATE\tPID\tAPPLICATION\tSESSION\tFOR\tBLOCKED BY"
	if showQuery {
		header += "\tQUERY"
	}
	fmt.Fprintln(tw, header)
	for _, li := range snap.Locks {
		state, dur := "held", ""
		if li.Granted {
			lo, lok, up, uok := holdBounds(li, snap.At)
			var parts []string
			if lok {
				parts = append(parts, ">="+fmtDuration(lo))
			}
			if uok {
				parts = append(parts, "<="+fmtDuration(up))
			}
			dur = strings.Join(parts, " ")
		} else {
			state = "waiting"
			dur = "<1s"
			if d, ok := waited(li, snap.At); ok {
				dur = fmtDuration(d)
			}
		}
		blocked := make([]string, len(li.BlockedBy))
		for i, p := range li.BlockedBy {
			blocked[i] = strconv.Itoa(int(p))
		}
		line := strings.Join([]string{
			li.Key.String(), modeName(li.Shared), state, strconv.Itoa(int(li.PID)),
			cell(li.ApplicationName, 64), cell(li.State, 0), orDash(dur), orDash(strings.Join(blocked, ",")),
		}, "\t")
		if showQuery {
			line += "\t" + cell(li.Query, 60)
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w, locksFootnote); err != nil {
		return err
	}
	if hint := namespaceHint(snap.Locks); hint != "" {
		_, err := fmt.Fprintln(w, hint)
		return err
	}
	return nil
}

// namespaceHint says, once, how to name the first numbers of pair keys that
// no known namespace names (pair:1001,1 may be ns:cron(1001)/1 to the
// service that took it), or "" when there are none.
func namespaceHint(locks []advisory.LockInfo) string {
	var ids []int32
	for _, li := range locks {
		if a, _, ok := li.Key.Pair(); ok && li.Namespace == "" && !slices.Contains(ids, a) {
			ids = append(ids, a)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = strconv.Itoa(int(id))
	}
	return fmt.Sprintf("PAIR KEYS: the first number of pair:A,B may be a namespace id (here: %s); name it with --ns NAME=%d\n"+
		"(repeatable) or %s=\"NAME=%d,...\" to show ns:NAME(%d)/B.", strings.Join(list, ", "), ids[0], envNamespaces, ids[0], ids[0])
}

// cell makes a value safe for one table cell: control characters, C0, DEL
// and C1 (tabs and newlines would break the table, ESC and CSI would reach
// the terminal), and the invisible format characters of invisibleFormat
// (a bidi override would reorder the rest of the row) become spaces, runs of spaces collapse, bytes that are not
// UTF-8 are shown as \xNN, and values longer than limit runes (if limit > 0)
// are cut with "...".
func cell(s string, limit int) string {
	s = escapeInvalidUTF8(s)
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || unicode.IsControl(r) || invisibleFormat(r) }), " ")
	if limit > 0 {
		if r := []rune(s); len(r) > limit {
			s = string(r[:limit-3]) + "..."
		}
	}
	return orDash(s)
}

// escapeInvalidUTF8 writes each byte of s that is not part of a UTF-8
// character as \xNN.
func escapeInvalidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[i])
		} else {
			b.WriteString(s[i : i+w])
		}
		i += w
	}
	return b.String()
}

// safeText makes a message of pgxlock's own (which may quote text from the
// server: an error, a database name) safe for a terminal: control
// characters other than newline and tab, C0, DEL and C1, and the invisible
// format characters of invisibleFormat (bidi controls, zero-width
// characters) are written as \xNN or \uNNNN, and bytes that are not UTF-8
// as \xNN.
func safeText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unsafeControl) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && w == 1, r < 0x80 && unsafeControl(r):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+w])
		}
		i += w
	}
	return b.String()
}

func unsafeControl(r rune) bool {
	return unicode.IsControl(r) && r != '\n' && r != '\t' || invisibleFormat(r)
}

// invisibleFormat reports whether r is a bidi control (U+200E, U+200F,
// U+202A..U+202E, U+2066..U+2069), which reorders the text that follows it
// on a terminal, or a zero-width character (U+200B..U+200D, U+2060,
// U+FEFF), which hides in it: the output filters treat them as control
// characters.
func invisibleFormat(r rune) bool {
	switch {
	case r == 0x200e, r == 0x200f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069,
		0x200b <= r && r <= 0x200d, r == 0x2060, r == 0xfeff:
		return true
	}
	return false
}

// msgf prints a message of pgxlock's own through safeText, as is: the
// subcommands use stdio.msgf, which also scrubs the connection settings'
// secrets. Never for the command's output, which `run` passes through as
// it is.
func msgf(w io.Writer, format string, a ...any) {
	fmt.Fprint(w, safeText(fmt.Sprintf(format, a...)))
}

// jsonControlSafe escapes DEL, the C1 control characters and the invisible
// format characters of invisibleFormat, which encoding/json leaves raw in
// strings (it escapes C0 ones), as \u007f, \u00NN and \uNNNN, and replaces bytes
// that are not UTF-8 (which a json.RawMessage may carry) by \ufffd, as
// encoding/json does in strings. The JSON means the same: outside strings
// the document is ASCII.
func jsonControlSafe(doc []byte) []byte {
	if !bytes.ContainsFunc(doc, func(r rune) bool { return r == utf8.RuneError || jsonEscaped(r) }) {
		return doc
	}
	out := make([]byte, 0, len(doc)+16)
	for i := 0; i < len(doc); {
		r, w := utf8.DecodeRune(doc[i:])
		switch {
		case r == utf8.RuneError && w == 1:
			out = append(out, `\ufffd`...)
		case jsonEscaped(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, doc[i:i+w]...)
		}
		i += w
	}
	return out
}

// jsonEscaped reports whether jsonControlSafe escapes r: DEL, C1 and the
// invisible format characters. (Outside strings the document holds none.)
func jsonEscaped(r rune) bool {
	return r == 0x7f || r >= 0x80 && unicode.IsControl(r) || invisibleFormat(r)
}

// encodeJSON writes v as one line of JSON (no HTML escaping), with
// jsonControlSafe applied.
func encodeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonControlSafe(buf.Bytes()))
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fmtDuration prints a duration compactly: 850ms, 12.3s, 5m03s, 2h01m, 3d04h.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// locksJSON is the --json document. Its field names are part of the CLI's
// interface (documented in doc.go); add fields, never rename them.
type locksJSON struct {
	At       time.Time  `json:"at"`       // server clock when listed
	Database string     `json:"database"` // current database
	Locks    []lockJSON `json:"locks"`    // never null
}

type lockJSON struct {
	Key             string     `json:"key"`       // keys.Key.String(): int64:N, pair:A,B or ns:NAME(A)/B
	Space           string     `json:"space"`     // "int64" or "pair"
	Int64           *string    `json:"int64"`     // decimal bigint of an int64 key (a string: exact in every JSON parser), else null
	Pair            *[2]int32  `json:"pair"`      // [A, B] of a pair key, else null
	Namespace       string     `json:"namespace"` // registered name of a pair key's first number, or ""
	Mode            string     `json:"mode"`      // "exclusive" or "shared"
	Granted         bool       `json:"granted"`   // held (true) or awaited (false)
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	State           string     `json:"state"` // pg_stat_activity.state
	BackendStart    *time.Time `json:"backend_start"`
	XactStart       *time.Time `json:"xact_start"`
	StateChange     *time.Time `json:"state_change"`
	WaitStart       *time.Time `json:"wait_start"`
	WaitedSeconds   *float64   `json:"waited_seconds"`   // waiters: at - wait_start
	HeldMinSeconds  *float64   `json:"held_min_seconds"` // holders: lower bound, see holdBounds
	HeldMaxSeconds  *float64   `json:"held_max_seconds"` // holders: upper bound (session age)
	BlockedBy       []int32    `json:"blocked_by"`       // never null
	Query           *string    `json:"query,omitempty"`  // only with --show-query
}

func writeLocksJSON(w io.Writer, snap snapshot, showQuery bool) error {
	doc := locksJSON{At: snap.At, Database: snap.Database, Locks: []lockJSON{}}
	for _, li := range snap.Locks {
		j := lockJSON{
			Key:             li.Key.String(),
			Space:           li.Key.Space().String(),
			Namespace:       li.Namespace,
			Mode:            modeName(li.Shared),
			Granted:         li.Granted,
			PID:             li.PID,
			ApplicationName: li.ApplicationName,
			State:           li.State,
			BackendStart:    timePtr(li.BackendStart),
			XactStart:       timePtr(li.XactStart),
			StateChange:     timePtr(li.StateChange),
			WaitStart:       timePtr(li.WaitStart),
			BlockedBy:       li.BlockedBy,
		}
		if j.BlockedBy == nil {
			j.BlockedBy = []int32{}
		}
		if v, ok := li.Key.Int64(); ok {
			s := strconv.FormatInt(v, 10)
			j.Int64 = &s
		}
		if a, b, ok := li.Key.Pair(); ok {
			j.Pair = &[2]int32{a, b}
		}
		if li.Granted {
			lo, lok, up, uok := holdBounds(li, snap.At)
			if lok {
				j.HeldMinSeconds = seconds(lo)
			}
			if uok {
				j.HeldMaxSeconds = seconds(up)
			}
		} else if d, ok := waited(li, snap.At); ok {
			j.WaitedSeconds = seconds(d)
		}
		if showQuery {
			q := li.Query
			j.Query = &q
		}
		doc.Locks = append(doc.Locks, j)
	}
	return encodeJSON(w, doc)
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func seconds(d time.Duration) *float64 {
	v := float64(d.Milliseconds()) / 1000
	return &v
}

// clockMicrosSQL is the server's clock as microseconds since the Unix epoch:
// a timestamp read as text (the Exec and simple protocol modes of a DSN's
// default_query_exec_mode) is parsed by pgx in the ISO DateStyle only, and
// the session's may be another.
const clockMicrosSQL = "(pg_catalog.extract('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8"

// serverClock reads the server's clock (see clockMicrosSQL).
func serverClock(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (time.Time, error) {
	var us int64
	if err := q.QueryRow(ctx, "SELECT "+clockMicrosSQL).Scan(&us); err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(us), nil
}
