package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Exit codes. The command's own status is passed through by `run`; these are
// pgxlock's, returned only when it did not run the command (or, for
// exitLockLost, when the lock went away while the command ran).
const (
	exitOK          = 0
	exitError       = 1   // unexpected failure (writing output, ...)
	exitUsage       = 64  // EX_USAGE: bad command line
	exitUnavailable = 69  // EX_UNAVAILABLE: cannot connect, or the database refused a query or a lock
	exitLockLost    = 70  // EX_SOFTWARE: run: the lock was lost while the command ran
	exitBusy        = 75  // EX_TEMPFAIL: run --try: the key is held by someone else
	exitTimeout     = 124 // run --wait: the wait timed out (as timeout(1))
	exitCannotExec  = 126 // run: the command was found but could not be started
	exitNotFound    = 127 // run: the command was not found
	exitSignalBase  = 128 // +N: killed by (or, before the command started, interrupted by) signal N
)

// appName is the application_name of every connection the CLI opens, so that
// `pgxlock locks` and pg_stat_activity show which backends are the CLI's.
const appName = "pgxlock-cli"

// connectTimeout bounds a connection attempt when the connection settings
// do not set connect_timeout.
const connectTimeout = 10 * time.Second

// stdio are the streams of one invocation. In is given to the command that
// `run` starts; Out and Err are pgxlock's own output (and the command's).
type stdio struct {
	In       io.Reader
	Out, Err io.Writer
	// hide returns the secrets of the invocation's connection settings
	// (see secretsOf), which s.msgf scrubs from every message; nil: none.
	hide func() []string
	// child is the stderr a command run by pgxlock gets, where Err is a
	// queue of pgxlock's own messages (notes); nil: Err.
	child io.Writer
}

// childErr is the stderr a command run by pgxlock gets.
func (s stdio) childErr() io.Writer {
	if s.child != nil {
		return s.child
	}
	return s.Err
}

// env is the environment of one invocation, as os.Environ returns it.
type env []string

// get returns the value of the last NAME=value entry for name, or "".
func (e env) get(name string) string {
	v := ""
	for _, kv := range e {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// run is the whole program: it dispatches to a subcommand and returns the
// process exit status. main passes os.Args[1:], the standard streams and
// os.Environ; tests pass their own.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, environ []string) int {
	e := env(environ)
	s := stdio{In: stdin, Out: stdout, Err: stderr, hide: sync.OnceValue(func() []string { return secretsOf(e) })}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "locks":
		return cmdLocks(ctx, rest, s, e)
	case "run":
		return cmdRun(ctx, rest, s, e)
	case "leases":
		return cmdLeases(ctx, rest, s, e)
	case "version", "--version":
		return cmdVersion(s)
	case "help", "-h", "-help", "--help":
		return cmdHelp(rest, s)
	default:
		fmt.Fprintf(stderr, "pgxlock: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
}

// usage is `pgxlock help`. Keep it in step with doc.go.
const usage = `pgxlock: inspect PostgreSQL advisory locks and leases, and run a command under a lock.

Usage:
  pgxlock locks  [--key K]... [--watch [--interval 1s]] [--json] [--show-query] [--ns NAME=ID]...
  pgxlock run    --key K [--try | --wait DURATION] [--shared] [--heartbeat 5s] [--grace 10s]
                 [--foreground] [-v] [--ns NAME=ID]... -- COMMAND [ARGS...]
  pgxlock leases [--table [SCHEMA.]TABLE] [--resource R] [--owner O] [--json]
  pgxlock version
  pgxlock help [COMMAND]

Connection: DATABASE_URL (URL or key=value string), else the libpq variables
PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE, ... (as psql).
Connections use application_name "pgxlock-cli".

Key syntax (K), exactly one of:
  123                  one bigint key: pg_advisory_lock(123) (decimal, optional sign)
  7,42                 two int4 keys: pg_advisory_lock(7, 42) (no spaces)
  int64:123            the same as 123 (the form "pgxlock locks" prints)
  pair:7,42            the same as 7,42
  ns:billing(7)/42     pair (7, 42), as printed for a registered namespace
  ns:billing/42        pair (7, 42) when billing=7 is given with --ns or PGXLOCK_NAMESPACES
  ns:billing/hash:S    keys.Namespace.Hash(S) in namespace billing (id from --ns, or billing(7))
  hash:S               keys.Hash(S) of exactly S (S may look like any of the above)
  other text           keys.Hash(K): the first 8 bytes of SHA-256(K), big-endian signed,
                       as other languages compute it (see package keys)
  Text that looks like a mistyped number or prefix is a usage error (exit 64),
  never a string to hash: 1,2,3  1e3  0x7b  7, 42  " 123"  INT64:5  tenant:acme.
  So is a number that does not fit its type (99999999999999999999, 7,3000000000).
  Write hash:... to hash such a string. Whenever a key is a hashed string,
  pgxlock says so on stderr with the key it names.
Namespaces: --ns NAME=ID (repeatable) or PGXLOCK_NAMESPACES="billing=7,jobs=8"
name the first number of pair keys in output and in key syntax.

Exit codes:
  0    success; for run: the command's own status is returned
  1    unexpected error
  64   usage error, including connection settings that cannot be parsed
  69   cannot connect to the database (refused, unreachable, or no answer
       within the connect timeout), or it refused a query or the lock
  70   run: the lock was lost while the command ran (the command was sent SIGTERM,
       then SIGKILL after --grace)
  75   run --try: the key is held by another session
  124  run --wait: the wait timed out
  126  run: the command could not be started
  127  run: the command was not found
  128+N  run: the command was killed by signal N, or pgxlock got signal N while
       waiting for the lock (the command did not run)

Run "pgxlock help COMMAND" for the flags of a command.
`

func cmdHelp(args []string, s stdio) int {
	if len(args) == 0 {
		fmt.Fprint(s.Out, usage)
		return exitOK
	}
	switch args[0] {
	case "locks", "run", "leases":
		// A subcommand's own -h prints its flags and returns exitOK.
		// Help asked for is output, so it goes to stdout.
		return run(context.Background(), []string{args[0], "-h"}, s.In, s.Out, s.Out, nil)
	case "version", "help":
		fmt.Fprint(s.Out, usage)
		return exitOK
	default:
		fmt.Fprintf(s.Err, "pgxlock: unknown command %q\n", args[0])
		return exitUsage
	}
}

// newFlagSet returns a FlagSet for a subcommand that reports errors instead
// of exiting, and prints its usage (synopsis, then flags) to w.
func newFlagSet(name, synopsis string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "Usage: %s\n\nFlags (-flag and --flag are the same):\n", synopsis)
		fs.PrintDefaults()
		fmt.Fprint(w, "\nSee \"pgxlock help\" for the key syntax, the connection settings and the exit codes.\n")
	}
	return fs
}

// parseFlags parses args with fs. It returns (exit status, false) when the
// caller must return at once: exitOK after -h, exitUsage after a bad flag
// (the flag package has printed why).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return exitOK, false
	case err != nil:
		return exitUsage, false
	}
	return 0, true
}

// usageError prints a usage message for a subcommand and returns exitUsage.
func usageError(s stdio, name, format string, a ...any) int {
	s.msgf(s.Err, "pgxlock %s: %s\n(run \"pgxlock help %s\" for usage)\n", name, fmt.Sprintf(format, a...), name)
	return exitUsage
}

// pgEnvSettings maps libpq environment variables to pgx connection settings,
// as pgconn.ParseConfig reads them from the process environment.
var pgEnvSettings = []struct{ env, setting string }{
	{"PGHOST", "host"},
	{"PGPORT", "port"},
	{"PGDATABASE", "database"},
	{"PGUSER", "user"},
	{"PGPASSWORD", "password"},
	{"PGPASSFILE", "passfile"},
	{"PGAPPNAME", "application_name"},
	{"PGCONNECT_TIMEOUT", "connect_timeout"},
	{"PGSSLMODE", "sslmode"},
	{"PGSSLKEY", "sslkey"},
	{"PGSSLCERT", "sslcert"},
	{"PGSSLCERTMODE", "sslcertmode"},
	{"PGSSLSNI", "sslsni"},
	{"PGSSLROOTCERT", "sslrootcert"},
	{"PGSSLPASSWORD", "sslpassword"},
	{"PGSSLNEGOTIATION", "sslnegotiation"},
	{"PGTARGETSESSIONATTRS", "target_session_attrs"},
	{"PGSERVICE", "service"},
	{"PGSERVICEFILE", "servicefile"},
	{"PGTZ", "timezone"},
	{"PGOPTIONS", "options"},
	{"PGMINPROTOCOLVERSION", "min_protocol_version"},
	{"PGMAXPROTOCOLVERSION", "max_protocol_version"},
	{"PGCHANNELBINDING", "channel_binding"},
	{"PGREQUIREAUTH", "require_auth"},
}

// connString returns the connection string of an invocation: DATABASE_URL if
// set, else a key=value string built from the PG* variables of e. For the
// real process (e is os.Environ) the latter is what pgx.ParseConfig("") would
// read itself; building it from e lets tests inject the variables.
func connString(e env) string {
	if u := e.get("DATABASE_URL"); u != "" {
		return u
	}
	var b strings.Builder
	for _, m := range pgEnvSettings {
		v := e.get(m.env)
		if v == "" {
			continue
		}
		// key='value' with \ and ' escaped: the libpq key/value syntax.
		v = strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)
		fmt.Fprintf(&b, "%s='%s' ", m.setting, v)
	}
	return strings.TrimSpace(b.String())
}

// errSettings marks connection settings that cannot be parsed (a malformed
// URL, a bad port, sslmode=bogus, an unreadable certificate file): a usage
// error, exit 64, since no retry can fix them.
var errSettings = errors.New("cannot parse the connection settings")

// connConfig parses the invocation's connection settings and sets the CLI's
// application_name (whatever the settings say, so that operators can always
// tell the CLI's backends apart) and a connect timeout if none is set. A
// parse failure wraps errSettings and shows the settings with every
// password replaced by xxxxx (see redactConnString) and the parser's
// reason, scrubbed of them (see parseReason).
func connConfig(e env) (*pgx.ConnConfig, error) {
	cs := connString(e)
	cfg, err := pgx.ParseConfig(cs)
	if err != nil {
		src := "the PG* environment variables"
		if e.get("DATABASE_URL") != "" {
			src = "DATABASE_URL"
		}
		shown, secrets := redactConnString(cs)
		return nil, fmt.Errorf("%w in %s (%s): %s", errSettings, src, shown, parseReason(err, secrets))
	}
	cfg.RuntimeParams["application_name"] = appName
	if cfg.ConnectTimeout == 0 && !connectTimeoutSet(cs) {
		cfg.ConnectTimeout = connectTimeout
	}
	return cfg, nil
}

// connFailed is the exit status for a failure to get a connection: 64 for
// settings that cannot be parsed, 69 for everything else.
func connFailed(err error) int {
	if errors.Is(err, errSettings) {
		return exitUsage
	}
	return exitUnavailable
}

// parseReason is the reason of a connection-string parse error without the
// connection string, which pgconn quotes with passwords masked only on a
// best-effort basis (and url.Parse quotes unmasked). The parser may also
// quote a piece of the input it choked on, which for a malformed string can
// be part of a password: every secret of hidden still in the text becomes
// xxxxx, so does every quoted piece of text that overlaps one, and if the
// text still shares four characters in a row with one, the reason is
// replaced by a generic one.
func parseReason(err error, hidden []string) string {
	msg := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		// "cannot parse `<connection string>`: <reason>"
		if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
			if _, reason, ok := strings.Cut(rest, "`: "); ok {
				msg = reason
			}
		}
		var ue *url.Error
		if errors.As(pce, &ue) {
			msg = strings.ReplaceAll(msg, ue.Error(), ue.Err.Error())
		}
	}
	if msg, ok := scrubAtLeast(msg, hidden, 1); ok {
		return msg
	}
	return reasonHidden
}

// reasonHidden replaces a parse error's reason that may quote part of a
// password.
const reasonHidden = `the parser's reason is not shown, as it may quote part of a password ` +
	`(in key=value form, write ' and \ in a quoted value as \' and \\; in a URL, percent-encode them)`

var (
	// scheme://: a URL, whatever pgx makes of it (with a leading space it
	// reads it as key=value, and quotes it whole in its error).
	reURLScheme = regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9+.-]*://`)
	// scheme://user:PASSWORD@host...: everything between the first colon
	// after the scheme and the last @ of the string, which over-masks a
	// malformed URL (a password with an unescaped / or ? in it, an @ in the
	// user name or the query) rather than show part of a password.
	// The user part may hold @, / or ? (the Azure "user@server" form
	// written without %40): the password starts at the first colon.
	reURLUserinfo = regexp.MustCompile(`^(\s*[A-Za-z][A-Za-z0-9+.-]*://[^:]*:)(.*)@`)
)

// isPasswordKey reports whether a setting's key (decoded) holds a secret:
// password, sslpassword, and any other key with "password" in it.
func isPasswordKey(k string) bool { return strings.Contains(strings.ToLower(k), "password") }

// knownKeys are the setting names that may end a password's value when
// masking it: libpq's and pgx's keywords and the run-time parameters most
// often given in connection strings. Text after a password that does not
// start one of these settings is masked as part of the password.
var knownKeys = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "database": true, "user": true,
	"password": true, "passfile": true, "connect_timeout": true, "sslmode": true, "ssl": true,
	"sslkey": true, "sslcert": true, "sslcertmode": true, "sslrootcert": true, "sslcrl": true,
	"sslcrldir": true, "sslnegotiation": true, "sslpassword": true, "sslsni": true,
	"sslcompression": true, "requiressl": true, "gssencmode": true, "gsslib": true,
	"krbspn": true, "krbsrvname": true, "target_session_attrs": true, "load_balance_hosts": true,
	"service": true, "servicefile": true, "min_protocol_version": true, "max_protocol_version": true,
	"channel_binding": true, "require_auth": true, "application_name": true,
	"fallback_application_name": true, "options": true, "timezone": true, "search_path": true,
	"client_encoding": true, "datestyle": true, "intervalstyle": true, "replication": true,
	"keepalives": true, "keepalives_idle": true, "keepalives_interval": true, "keepalives_count": true,
	"tcp_user_timeout": true, "statement_timeout": true, "lock_timeout": true,
	"idle_in_transaction_session_timeout": true, "statement_cache_capacity": true,
	"description_cache_capacity": true, "default_query_exec_mode": true, "min_read_buffer_size": true,
}

func init() {
	for _, m := range pgEnvSettings {
		knownKeys[m.setting] = true
	}
}

// span is a value's place in a connection string: cs[start:end].
type span struct {
	key        string // decoded
	start, end int
	closed     bool // not an unterminated quoted value
}

// isSpace is the white space of the key/value syntax.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// kvSettings lists the key=value settings of a libpq key/value string:
// keys up to "=", values single-quoted (with \' and \\ escapes) or
// unquoted up to whitespace (with backslash escapes). A malformed string
// gives the settings up to where it stops making sense.
func kvSettings(cs string) []span {
	var out []span
	n, i := len(cs), 0
	space := func() {
		for i < n && isSpace(cs[i]) {
			i++
		}
	}
	for {
		space()
		if i >= n {
			return out
		}
		ks := i
		for i < n && cs[i] != '=' && !isSpace(cs[i]) {
			i++
		}
		key := cs[ks:i]
		space()
		if i >= n || cs[i] != '=' {
			continue // a key without a value: the parser refuses it; go on
		}
		i++
		space()
		vs := i
		closed := true
		if i < n && cs[i] == '\'' {
			closed = false
			for i++; i < n; i++ {
				if cs[i] == '\\' {
					i++
				} else if cs[i] == '\'' {
					i++
					closed = true
					break
				}
			}
		} else {
			for ; i < n && !isSpace(cs[i]); i++ {
				if cs[i] == '\\' {
					i++
				}
			}
		}
		out = append(out, span{key: key, start: vs, end: min(i, n), closed: closed})
	}
}

// urlSettings lists the query settings of a URL connection string, keys
// percent-decoded (pass%77ord is password to pgx): the &-separated pairs
// after the first ? that follows from (the end of the user info). As for
// pgx (and libpq), # and ; are part of a value.
func urlSettings(cs string, from int) []span {
	q := strings.IndexByte(cs[from:], '?')
	if q < 0 {
		return nil
	}
	start := from + q + 1
	end := len(cs)
	var out []span
	for i := start; i <= end; {
		j := strings.IndexByte(cs[i:end], '&')
		if j < 0 {
			j = end - i
		}
		seg := cs[i : i+j]
		if k, _, ok := strings.Cut(seg, "="); ok {
			key := k
			if d, err := url.QueryUnescape(k); err == nil {
				key = d
			}
			out = append(out, span{key: key, start: i + len(k) + 1, end: i + j, closed: true})
		}
		i += j + 1
	}
	return out
}

// settings lists the settings of a connection string in either form, and
// where a URL's query starts looking (0 for key=value).
func settings(cs string) []span {
	if reURLScheme.MatchString(cs) {
		from := 0
		if m := reURLUserinfo.FindStringSubmatchIndex(cs); m != nil {
			from = m[5]
		}
		return urlSettings(cs, from)
	}
	return kvSettings(cs)
}

// startsKnownKV reports whether rest, the text after a key/value string's
// value, is only white space or starts with a known key and its "=".
func startsKnownKV(rest string) bool {
	rest = strings.TrimLeft(rest, " \t\n\r\f\v")
	if rest == "" {
		return true
	}
	i := strings.IndexFunc(rest, func(r rune) bool { return r == '=' || r < 0x80 && isSpace(byte(r)) })
	if i <= 0 || !knownKeys[rest[:i]] {
		return false
	}
	return strings.HasPrefix(strings.TrimLeft(rest[i:], " \t\n\r\f\v"), "=")
}

// passwordEnd is where the masking of a password value that starts at
// sp.start ends. It ends with the value only when the value parsed cleanly
// and what follows is the end of the string or a known setting (in a URL:
// "&" and a known key's "="); else at the end of the string, since the rest
// may be the password's (a quote or & in it that was not escaped).
func passwordEnd(cs string, sp span, isURL bool) int {
	if isURL {
		for i := sp.start; i < len(cs); i++ {
			if cs[i] != '&' {
				continue
			}
			if k, _, ok := strings.Cut(cs[i+1:], "="); ok && knownKeys[k] {
				return i
			}
		}
		return len(cs)
	}
	if sp.closed && startsKnownKV(cs[sp.end:]) {
		return sp.end
	}
	return len(cs)
}

// decodedIndex is s percent-decoded and lower-cased, with the offset in s
// of each of its bytes, and the offset just past it.
func decodedIndex(s string) (string, []int, []int) {
	var b []byte
	var at, past []int
	for i := 0; i < len(s); {
		c, w := s[i], 1
		if c == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				c, w = byte(v), 3
			}
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
		at, past = append(at, i), append(past, i+w)
		i += w
	}
	return string(b), at, past
}

// redactConnString returns the connection string with its passwords
// replaced by xxxxx, and the replaced texts (as written and decoded) so
// that they can be scrubbed from other text. A password whose value does
// not parse cleanly, and any "password" the settings parser did not find
// as a key (the string went wrong before it), is masked to the end of the
// string: no part of a password is ever shown.
func redactConnString(cs string) (string, []string) {
	n := len(cs)
	isURL := reURLScheme.MatchString(cs)
	var spans []span
	if isURL {
		if m := reURLUserinfo.FindStringSubmatchIndex(cs); m != nil {
			spans = append(spans, span{start: m[4], end: m[5]})
		}
		// Both from the user info's end and from the first ?: the user info
		// found may be wrong for a malformed URL.
		for _, sp := range append(settings(cs), urlSettings(cs, 0)...) {
			if isPasswordKey(sp.key) {
				spans = append(spans, span{start: sp.start, end: passwordEnd(cs, sp, true)})
			}
		}
	} else {
		for _, sp := range kvSettings(cs) {
			if isPasswordKey(sp.key) {
				spans = append(spans, span{start: sp.start, end: passwordEnd(cs, sp, false)})
			}
		}
	}
	covered := func(i int) bool {
		for _, sp := range spans {
			if sp.start <= i && i < sp.end || sp.start == i {
				return true
			}
		}
		return false
	}
	// Any other "password" (percent-encoded or not, any case): mask from
	// its value (past any "=", ":" and white space) to the end of the string.
	dec, at, past := decodedIndex(cs)
	for off := 0; ; {
		k := strings.Index(dec[off:], "password")
		if k < 0 {
			break
		}
		k += off
		off = k + 1
		if covered(at[k]) {
			continue
		}
		v := past[k+len("password")-1]
		for v < n && (isSpace(cs[v]) || cs[v] == '=' || cs[v] == ':') {
			v++
		}
		if !covered(v) {
			spans = append(spans, span{start: v, end: n})
		}
	}
	// Merge, then mask from the end backwards so that earlier offsets hold.
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	var merged []span
	for _, sp := range spans {
		if sp.end <= sp.start {
			continue
		}
		if l := len(merged) - 1; l >= 0 && sp.start <= merged[l].end {
			merged[l].end = max(merged[l].end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	var hidden []string
	keep := func(v string) {
		if v == "" {
			return
		}
		hidden = append(hidden, v)
		if d, err := url.QueryUnescape(v); err == nil && d != v {
			hidden = append(hidden, d)
		}
		if t := strings.Trim(v, "'"); t != v && t != "" {
			hidden = append(hidden, t)
		}
		if u := unescapeKV(strings.Trim(v, "'")); u != v && u != "" {
			hidden = append(hidden, u) // as the parser decoded it
		}
	}
	for i := len(merged) - 1; i >= 0; i-- {
		sp := merged[i]
		keep(cs[sp.start:sp.end])
		cs = cs[:sp.start] + "xxxxx" + cs[sp.end:]
	}
	// Longest first, so that a secret containing another is replaced whole.
	slices.SortFunc(hidden, func(a, b string) int { return len(b) - len(a) })
	return cs, hidden
}

// connectTimeoutSet reports whether the connection string sets
// connect_timeout (to 0, no timeout, as libpq and pgx read it, included):
// pgx reports 0 both for that and for no setting, and the CLI's default
// applies to the latter only. (A service file's connect_timeout=0 is not
// seen here: it reads as unset.)
func connectTimeoutSet(cs string) bool {
	for _, sp := range settings(cs) {
		if strings.EqualFold(sp.key, "connect_timeout") {
			return true
		}
	}
	return false
}

// unescapeKV removes the backslash escapes of a key/value connection
// string's value.
func unescapeKV(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// connect opens one connection for the read-only subcommands.
func connect(ctx context.Context, e env) (*pgx.Conn, error) {
	cfg, err := connConfig(e)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// closeConn closes conn under a short bound of its own: the caller's context
// may have ended already (SIGINT during --watch).
func closeConn(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = conn.Close(cctx)
}

// isTerminal reports whether w is a character device (a terminal), where
// --watch clears the screen between frames.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
