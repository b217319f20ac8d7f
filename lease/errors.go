package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Every error this package returns is an *Error wrapping one or
// more of these (or a driver error), so test with errors.Is, never with ==.
var (
	// ErrNotAcquired means the lease is held by someone else. TryAcquire and
	// TryDo return it at once; Acquire and Do return it joined with the
	// context's error when the context ends while waiting.
	ErrNotAcquired = errors.New("lease: not acquired")

	// ErrLeaseLost means the caller no longer holds the lease it names: it
	// expired, was taken over by a later acquirer, was swept, released, or its
	// row was changed by someone else. Renew and Release return it; Do cancels
	// its callback's context with it as the cause. A stale fencing token in a
	// protected write (Fence.Update) also reports it.
	ErrLeaseLost = errors.New("lease: lost")

	// ErrNotReleased means Do's final release failed (after retrying on a
	// fresh connection when the pooled one was dead): the callback's work is
	// done, but the lease may stay held until its TTL, keeping others out.
	// Do returns it joined with the release's cause and the callback's own
	// error (nil when the work succeeded: "the external calls succeeded, the
	// release failed"). It is not returned when the lease was lost instead.
	ErrNotReleased = errors.New("lease: not released")

	// ErrNotFound means the row a column lease (or a fenced write) names does
	// not exist. It is distinct from ErrNotAcquired so that a typo in an id is
	// not mistaken for contention.
	ErrNotFound = errors.New("lease: row not found")

	// ErrInvalid means bad input, found before any SQL is sent: an empty or
	// oversized resource, a TTL below MinTTL, a renew interval that does not
	// fit inside the TTL, an invalid identifier (one with a control character,
	// 0x00-0x1F or 0x7F, among them; or a schema-qualified table
	// name: use the Schema field), an unknown mode, metadata that is not JSON
	// or that jsonb cannot store (invalid UTF-8, a \u0000 escape, an
	// unpaired UTF-16 surrogate escape, a number outside numeric's range),
	// a nil or typed-nil row id or Fence.Update key, or a string-like one
	// (string kind, []byte, or a pointer to either) with a NUL byte, invalid
	// UTF-8 or more than MaxResourceLen bytes, a
	// NUL byte or invalid UTF-8 in a List or ListIntents filter.
	ErrInvalid = errors.New("lease: invalid argument")
)

// Error is the typed error returned by every operation. It names the operation
// and the resource (for a column lease, the row id printed with %v) and wraps
// the cause: one of the sentinels above, a context error, a *pgconn.PgError,
// or several of them joined. Use errors.Is / errors.As on it.
type Error struct {
	Op       string // "acquire", "try acquire", "renew", "release", ...
	Resource string // resource name or row id; empty for table-wide operations
	Err      error

	asIs bool // Err's text includes the caller's (Do's callback): print it unedited
}

// Error renders "lease: <op> \"<resource>\": <cause>" (without the resource for
// table-wide operations). The cause's text is cut past about 4 KiB (the
// error itself is untouched), so that an input the server quotes back (a
// 1 MB id of a type the package cannot check, on a bigint id column) is not
// copied whole into every log line.
func (e *Error) Error() string {
	// The sentinels already carry the "lease: " prefix; do not print it twice.
	msg := "<nil>"
	switch {
	case e.Err != nil && e.asIs:
		msg = e.Err.Error()
	case e.Err != nil:
		msg = clipN(strings.ReplaceAll(e.Err.Error(), "lease: ", ""), maxErrorCauseLen)
	}
	if e.Resource == "" {
		return "lease: " + e.Op + ": " + msg
	}
	return fmt.Sprintf("lease: %s %q: %s", e.Op, e.Resource, msg)
}

// Unwrap returns the wrapped cause.
func (e *Error) Unwrap() error { return e.Err }

func opError(op, resource string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Resource: clip(resource), Err: err}
}

// MaxErrorResourceLen is about the longest resource name or row id an Error
// carries, in bytes; one longer by more than 32 bytes is cut to this length
// (on a UTF-8 boundary) and marked with its full length, so that a hostile 10 MB id does not end up
// copied into every error string and log line.
const MaxErrorResourceLen = 256

// maxErrorCauseLen is about the longest cause text Error prints.
const maxErrorCauseLen = 4096

func clip(s string) string { return clipN(s, MaxErrorResourceLen) }

func clipN(s string, max int) string {
	// The slack keeps clip idempotent: a clipped string (at most
	// max bytes plus the marker) is not clipped again.
	if len(s) <= max+32 {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:n], len(s))
}

// resourceOf formats a row id for errors: as text for the string-like ids
// idText knows, else %v, cut short like every resource.
func resourceOf(id any) string {
	if s, ok, _ := idText(id); ok {
		return clip(s)
	}
	return clip(fmt.Sprint(id))
}

// idText returns the text a string-like id reaches the database as: a string
// (or a type whose kind is string), a []byte (or a slice of a byte kind),
// through any number of pointers. ok is false for any other id; isNil reports
// a nil pointer on the way.
func idText(id any) (text string, ok, isNil bool) {
	if id == nil {
		return "", false, true
	}
	v := reflect.ValueOf(id)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "", false, true
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.String:
		return v.String(), true, false
	case reflect.Slice:
		if v.IsNil() {
			return "", false, true
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return string(v.Bytes()), true, false
		}
	}
	return "", false, false
}

// checkID validates a column lease's row id: PostgreSQL would reject a NUL
// byte or invalid UTF-8 in a text id with a less helpful error (22021), a
// string id longer than MaxResourceLen cannot be a sensible key (and would be
// quoted whole in the server's error messages), and
// a nil or typed-nil id (a nil *int64) can only ever match no row. The
// string checks apply to every string-like id (see idText): a named string
// type, a pointer to a string, a []byte.
func checkID(id any) error {
	if id == nil {
		return fmt.Errorf("%w: nil id", ErrInvalid)
	}
	switch v := reflect.ValueOf(id); v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		if v.IsNil() {
			return fmt.Errorf("%w: nil id (%T)", ErrInvalid, id)
		}
	}
	s, ok, isNil := idText(id)
	if isNil {
		return fmt.Errorf("%w: nil id (%T)", ErrInvalid, id)
	}
	if ok {
		switch {
		case len(s) > MaxResourceLen:
			return fmt.Errorf("%w: id is longer than %d bytes", ErrInvalid, MaxResourceLen)
		case strings.ContainsRune(s, 0):
			return fmt.Errorf("%w: id contains a NUL byte", ErrInvalid)
		case !utf8.ValidString(s):
			return fmt.Errorf("%w: id is not valid UTF-8", ErrInvalid)
		}
	}
	return nil
}

// MinTTL is the shortest TTL accepted anywhere (ColumnConfig, ManagerConfig,
// AcquireOptions). PostgreSQL truncates intervals below a microsecond to
// zero, so a TTL given in the wrong unit (30 meaning 30ns) would give no
// exclusion at all; and a lease shorter than a few round trips and a
// scheduling pause cannot be renewed in time anyway.
const MinTTL = 100 * time.Millisecond

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: TTL must be at least %v, got %v", ErrInvalid, MinTTL, ttl)
	}
	return nil
}

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1. Longer names are silently
// truncated by the server, which could make two configured names collide, so
// they are rejected instead.
const maxIdentifierLen = 63

// MaxResourceLen is the longest resource name accepted, in bytes. It keeps
// index entries far below the btree limit.
const MaxResourceLen = 1024

func checkIdentifier(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	case len(name) > maxIdentifierLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, what, maxIdentifierLen)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	case strings.ContainsFunc(name, isControl):
		return fmt.Errorf("%w: %s contains a control character (0x00-0x1F or 0x7F)", ErrInvalid, what)
	}
	return nil
}

// isControl reports an ASCII control character: 0x00-0x1F or 0x7F. None
// belongs in an identifier, and a CR or LF inside a quoted name is a line
// break to anything that reads the SQL text line by line.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// checkText validates a value stored in a text column: PostgreSQL rejects NUL
// bytes and invalid UTF-8 in text, and an error from the server would be a
// less helpful way to find out.
func checkText(what, s string, maxLen int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	case len(s) > maxLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, what, maxLen)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

// outcomeUnknown reports whether a statement that failed with err may
// nevertheless have committed: the request left the client, and no error
// came back from the server. An error from the server means the (implicit)
// transaction rolled back; pgconn.SafeToRetry means nothing was sent.
func outcomeUnknown(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// checkTable refuses a table name with a dot: "public.users" is one
// identifier to PostgreSQL (a table literally named so), which is never what
// was meant. The schema goes in the Schema field.
func checkTable(name string) error {
	if len(name) > maxIdentifierLen { // reported, without the name, by checkIdentifier
		return nil
	}
	if strings.Contains(name, ".") {
		return fmt.Errorf("%w: table %q contains a dot; put the schema in the Schema field (Schema: %q, Table: %q)",
			ErrInvalid, name, name[:strings.Index(name, ".")], name[strings.Index(name, ".")+1:])
	}
	return nil
}

// checkMetadata accepts JSON that a jsonb column can store: valid JSON in
// valid UTF-8, with no \u0000 in any string or key (jsonb rejects it with
// 22P05), no unpaired
// UTF-16 surrogate escape (22P02), and no number outside PostgreSQL's numeric
// range (22003; see checkNumber).
func checkMetadata(raw []byte) error {
	if !json.Valid(raw) {
		return fmt.Errorf("%w: metadata is not valid JSON", ErrInvalid)
	}
	if !utf8.Valid(raw) { // json.Valid accepts any bytes in a string; text does not (22021)
		return fmt.Errorf("%w: metadata is not valid UTF-8", ErrInvalid)
	}
	if err := checkJSONTokens(raw); err != nil {
		return fmt.Errorf("%w: metadata %w", ErrInvalid, err)
	}
	if !bytes.Contains(raw, []byte(`\u0000`)) {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("%w: metadata: %v", ErrInvalid, err)
	}
	if hasNUL(v) {
		return fmt.Errorf("%w: metadata contains \\u0000, which jsonb cannot store", ErrInvalid)
	}
	return nil
}

// checkJSONTokens scans valid JSON for what encoding/json accepts and jsonb
// refuses: a \u escape of a UTF-16 surrogate that is not part of a pair
// (encoding/json silently turns it into U+FFFD), and a number numeric cannot
// hold. Outside strings, a JSON number is the only token that starts with
// '-' or a digit.
func checkJSONTokens(raw []byte) error {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			for i++; raw[i] != '"'; i++ {
				if raw[i] != '\\' {
					continue
				}
				i++
				if raw[i] != 'u' {
					continue
				}
				r, _ := strconv.ParseUint(string(raw[i+1:i+5]), 16, 32)
				i += 4
				switch {
				case r >= 0xDC00 && r <= 0xDFFF:
					return errors.New("contains an unpaired UTF-16 surrogate escape, which jsonb cannot store")
				case r >= 0xD800 && r <= 0xDBFF:
					if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
						return errors.New("contains an unpaired UTF-16 surrogate escape, which jsonb cannot store")
					}
					lo, _ := strconv.ParseUint(string(raw[i+3:i+7]), 16, 32)
					if lo < 0xDC00 || lo > 0xDFFF {
						return errors.New("contains an unpaired UTF-16 surrogate escape, which jsonb cannot store")
					}
					i += 6
				}
			}
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(raw) && strings.IndexByte("+-.eE0123456789", raw[j]) >= 0 {
				j++
			}
			if err := checkNumber(string(raw[i:j])); err != nil {
				return err
			}
			i = j - 1
		}
	}
	return nil
}

// PostgreSQL's numeric range: up to 131072 digits before the decimal point
// and 16383 after it; an exponent's magnitude below INT_MAX/2.
const (
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
	maxNumericExponent   = 1<<30 - 1
)

// checkNumber refuses a JSON number (valid syntax) that jsonb would store as
// a numeric out of range (22003), as numeric_in counts: the scale is the
// digits written after the point minus the exponent, and the integer digits
// are those from the most significant non-zero digit to the point.
func checkNumber(num string) error {
	tooBig := fmt.Errorf("contains a number outside PostgreSQL's numeric range (%s)", clip(num))
	mant, exp := num, int64(0)
	if k := strings.IndexAny(num, "eE"); k >= 0 {
		mant = num[:k]
		e, err := strconv.ParseInt(strings.TrimPrefix(num[k+1:], "+"), 10, 64)
		if err != nil || e >= maxNumericExponent || e <= -maxNumericExponent {
			return tooBig
		}
		exp = e
	}
	mant = strings.TrimPrefix(mant, "-")
	intPart, frac, _ := strings.Cut(mant, ".")
	if int64(len(frac))-exp > maxNumericFracDigits {
		return tooBig
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" { // zero
		return nil
	}
	// Decimal exponent of the most significant digit, plus one: the count
	// of digits before the point.
	if int64(len(digits)-len(frac))+exp > maxNumericIntDigits {
		return tooBig
	}
	return nil
}

func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, 0)
	case []any:
		for _, e := range v {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}
