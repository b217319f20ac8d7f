package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlock/pgxlock/lease"
)

const leasesSynopsis = "pgxlock leases [--table [SCHEMA.]TABLE] [--resource R] [--owner O] [--json]"

func cmdLeases(ctx context.Context, args []string, s stdio, e env) int {
	var (
		table, resource, owner string
		asJSON                 bool
	)
	fs := newFlagSet("leases", leasesSynopsis, s.Err)
	fs.StringVar(&table, "table", lease.DefaultTable, "the lock-manager table, `[SCHEMA.]TABLE` (no schema: the search_path decides)")
	fs.StringVar(&resource, "resource", "", "show only this resource")
	fs.StringVar(&owner, "owner", "", "show only leases with this owner label")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(s, "leases", "unexpected argument %q", fs.Arg(0))
	}
	schema, name, ok := splitTable(table)
	if !ok {
		return usageError(s, "leases", "--table %q: want TABLE or SCHEMA.TABLE", table)
	}

	cfg, err := connConfig(e)
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: %v\n", err)
		return connFailed(err)
	}
	pcfg, err := pgxpool.ParseConfig("")
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: %v\n", err)
		return exitError
	}
	pcfg.ConnConfig = cfg
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: %v\n", err)
		return exitUnavailable
	}
	defer pool.Close()
	// The TTL is required by NewManager but unused by List.
	m, err := lease.NewManager(pool, lease.ManagerConfig{Schema: schema, Table: name, TTL: time.Minute})
	if err != nil {
		return usageError(s, "leases", "--table %q: %v", table, err)
	}
	holders, err := m.List(ctx, &lease.ListOptions{Resource: resource, Owner: owner, IncludeExpired: true})
	if err != nil {
		if errors.Is(err, lease.ErrInvalid) { // a bad --resource or --owner, refused before any SQL
			return usageError(s, "leases", "%v", err)
		}
		if notLeaseTable(err) {
			s.msgf(s.Err, "pgxlock leases: %q is not a pgxlock lease table (%v); pass --table [SCHEMA.]TABLE as in lease.ManagerConfig\n", table, err)
			return exitUnavailable
		}
		s.msgf(s.Err, "pgxlock leases: %v%s\n", err, missingTableHint(err, table))
		return exitUnavailable
	}
	intents, err := m.ListIntents(ctx, &lease.ListOptions{Resource: resource, IncludeExpired: true})
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: %v\n", err)
		return exitUnavailable
	}
	now, err := serverClock(ctx, pool)
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: read the server clock: %v\n", err)
		return exitUnavailable
	}
	if asJSON {
		err = writeLeasesJSON(s.Out, table, now, holders, intents)
	} else {
		err = writeLeasesText(s.Out, now, holders, intents)
	}
	if err != nil {
		s.msgf(s.Err, "pgxlock leases: %v\n", err)
		return exitError
	}
	return exitOK
}

// splitTable splits "schema.table" at its first dot; a name without a dot
// has no schema. Quoted identifiers holding dots are not supported.
func splitTable(s string) (schema, table string, ok bool) {
	if s == "" {
		return "", "", false
	}
	schema, table, found := strings.Cut(s, ".")
	if !found {
		return "", s, true
	}
	if schema == "" || table == "" || strings.Contains(table, ".") {
		return "", "", false
	}
	return schema, table, true
}

// notLeaseTable reports a table that exists but lacks the lease columns
// (42703 undefined_column): some other table was named with --table.
func notLeaseTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42703"
}

func missingTableHint(err error, table string) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Sprintf("\n(no lease table %q here: pass --table [SCHEMA.]TABLE as in lease.ManagerConfig, or create it with lease.Manager.Migrate)", table)
	}
	return ""
}

// leasesFootnote explains the STATE column.
const leasesFootnote = `STATE: live, or expired (past expires_at by the server's clock and not yet removed; the next
acquirer or a sweep removes it, and it blocks nobody).`

func writeLeasesText(w io.Writer, now time.Time, holders []lease.Holder, intents []lease.Intent) error {
	if err := writeIntentsText(w, now, intents); err != nil {
		return err
	}
	if len(holders) == 0 {
		_, err := fmt.Fprintln(w, "no leases")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tMODE\tSTATE\tTOKEN\tOWNER\tACQUIRED\tEXPIRES")
	for _, h := range holders {
		state := "live"
		if h.Expired {
			state = "expired"
		}
		expires := "in " + fmtBetween(now, h.ExpiresAt)
		if d := now.Sub(h.ExpiresAt); d >= 0 || h.Expired {
			expires = fmtBetween(h.ExpiresAt, now) + " ago"
		}
		acquired := fmtBetween(h.AcquiredAt, now) + " ago"
		expires, acquired = infiniteCell(h.ExpiresAt, expires), infiniteCell(h.AcquiredAt, acquired)
		fmt.Fprintln(tw, strings.Join([]string{
			quoteCell(h.Resource, 60), h.Mode.String(), state, strconv.FormatInt(h.Token, 10),
			quoteCell(h.Owner, 40), acquired, expires,
		}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, leasesFootnote)
	return err
}

// writeIntentsText lists waiting writers first: while one waits, new readers
// of its resource are refused, which the holder table alone does not show.
func writeIntentsText(w io.Writer, now time.Time, intents []lease.Intent) error {
	if len(intents) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WAITING WRITER FOR\tSTATE\tUNTIL")
	for _, in := range intents {
		state, until := "waiting", "in "+fmtBetween(now, in.Until)
		if in.Expired {
			state, until = "lapsed", fmtBetween(in.Until, now)+" ago"
		}
		until = infiniteCell(in.Until, until)
		fmt.Fprintln(tw, strings.Join([]string{quoteCell(in.Resource, 60), state, until}, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "(new shared leases of these resources are refused while a writer waits)")
	return err
}

// quoteCell shows a user-chosen name in one table cell: as is when it is
// plain, quoted (Go syntax) when it holds spaces, control characters (C0,
// DEL or C1), invisible format characters (bidi controls, zero-width
// characters: see invisibleFormat) or bytes that are not UTF-8, cut to
// limit runes.
func quoteCell(s string, limit int) string {
	if s == "" || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || unicode.IsControl(r) || invisibleFormat(r) }) {
		s = strconv.Quote(s)
	}
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit-3]) + "..."
	}
	return s
}

// The times lease.List gives for a row edited by hand to 'infinity' or
// '-infinity' (lease.Holder.ExpiresAt).
var (
	forever = time.UnixMicro(math.MaxInt64)
	never   = time.UnixMicro(math.MinInt64)
)

// infiniteCell is the text cell of t: "never" for a time of 'infinity',
// "-infinity" for one of '-infinity', else cell.
func infiniteCell(t time.Time, cell string) string {
	switch {
	case t.Equal(forever):
		return "never"
	case t.Equal(never):
		return "-infinity"
	}
	return cell
}

// jsonTime is a time in the --json document: RFC 3339 as encoding/json
// writes it, "infinity" or "-infinity" for a time edited so by hand, and,
// for a year beyond 0-9999 (which RFC 3339 cannot write and encoding/json
// refuses), the same layout with as many year digits as needed.
type jsonTime time.Time

func (t jsonTime) MarshalJSON() ([]byte, error) {
	tt := time.Time(t)
	switch {
	case tt.Equal(forever):
		return []byte(`"infinity"`), nil
	case tt.Equal(never):
		return []byte(`"-infinity"`), nil
	case tt.Year() < 0 || tt.Year() > 9999:
		return json.Marshal(tt.Format(time.RFC3339Nano))
	}
	return tt.MarshalJSON()
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *jsonTime) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"infinity"`:
		*t = jsonTime(forever)
		return nil
	case `"-infinity"`:
		*t = jsonTime(never)
		return nil
	}
	var tt time.Time
	if err := tt.UnmarshalJSON(b); err == nil {
		*t = jsonTime(tt)
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return err
	}
	tt, err := time.Parse(time.RFC3339Nano, str)
	*t = jsonTime(tt)
	return err
}

// secondsUntil is t - now in seconds, or nil (JSON null) when t is
// 'infinity' or '-infinity'. Milliseconds since the epoch, not t.Sub(now):
// a Duration stops at about 292 years.
func secondsUntil(t, now time.Time) *float64 {
	if t.Equal(forever) || t.Equal(never) {
		return nil
	}
	s := float64(t.UnixMilli()-now.UnixMilli()) / 1000
	return &s
}

// fmtBetween formats to - from, at least 0: as fmtDuration, and in years
// past what a Duration holds (about 292 years).
func fmtBetween(from, to time.Time) string {
	ms := to.UnixMilli() - from.UnixMilli()
	if ms <= 0 {
		return fmtDuration(0)
	}
	const year = 365.25 * 24 * 3600 * 1000
	if ms > int64(math.MaxInt64/time.Millisecond) {
		return fmt.Sprintf("%.0fy", float64(ms)/year)
	}
	return fmtDuration(time.Duration(ms) * time.Millisecond)
}

// leasesJSON is the --json document of `leases`; its field names are part
// of the CLI's interface (documented in doc.go).
type leasesJSON struct {
	At      time.Time    `json:"at"`    // server clock when listed
	Table   string       `json:"table"` // as given to --table
	Leases  []leaseJSON  `json:"leases"`
	Intents []intentJSON `json:"writer_intents"` // waiting writers
}

type intentJSON struct {
	Resource       string   `json:"resource"`
	Until          jsonTime `json:"until"`
	Expired        bool     `json:"expired"`          // lapsed: blocks nobody
	UntilInSeconds *float64 `json:"until_in_seconds"` // negative once lapsed; null for an infinite time
}

type leaseJSON struct {
	Resource         string          `json:"resource"`
	Mode             string          `json:"mode"` // "exclusive" or "shared"
	Owner            string          `json:"owner"`
	Token            int64           `json:"token"` // fencing token
	AcquiredAt       jsonTime        `json:"acquired_at"`
	ExpiresAt        jsonTime        `json:"expires_at"`
	Expired          bool            `json:"expired"`
	ExpiresInSeconds *float64        `json:"expires_in_seconds"` // negative once expired; null for an infinite time
	Metadata         json.RawMessage `json:"metadata"`           // as stored; null if none
}

func writeLeasesJSON(w io.Writer, table string, now time.Time, holders []lease.Holder, intents []lease.Intent) error {
	doc := leasesJSON{At: now, Table: table, Leases: []leaseJSON{}, Intents: []intentJSON{}}
	for _, in := range intents {
		doc.Intents = append(doc.Intents, intentJSON{Resource: in.Resource, Until: jsonTime(in.Until), Expired: in.Expired,
			UntilInSeconds: secondsUntil(in.Until, now)})
	}
	for _, h := range holders {
		meta := h.Metadata
		if meta == nil {
			meta = json.RawMessage("null")
		}
		doc.Leases = append(doc.Leases, leaseJSON{
			Resource: h.Resource, Mode: h.Mode.String(), Owner: h.Owner, Token: h.Token,
			AcquiredAt: jsonTime(h.AcquiredAt), ExpiresAt: jsonTime(h.ExpiresAt), Expired: h.Expired,
			ExpiresInSeconds: secondsUntil(h.ExpiresAt, now),
			Metadata:         meta,
		})
	}
	return encodeJSON(w, doc)
}
