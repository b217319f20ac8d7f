package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// secretsOf is every text of an invocation's connection settings that is or
// may be (part of) a password, which no message of pgxlock may show: the
// password pgx parsed (from the settings, PGPASSWORD or a password file); PGPASSWORD and PGSSLPASSWORD as given; and what
// redactConnString masks, which over-masks a string that is not clean (the
// whole user info after its first colon up to the last @, a query or
// key=value password that does not end cleanly to the end of the string).
// These reach messages in ways the parse error alone does not cover: a URL
// with a leading space or an upper-case scheme is key=value for pgx, which
// sends it whole to the server as a parameter name, and the server's error
// quotes it; the tail of a password with an unescaped & or ' becomes a
// parameter the server names; a URL password with a / makes pgx's
// "database=" show its tail. Longest first.
func secretsOf(e env) []string {
	cs := connString(e)
	_, hidden := redactConnString(cs)
	add := func(v string) {
		if v != "" && !slices.Contains(hidden, v) {
			hidden = append(hidden, v)
		}
	}
	for _, name := range []string{"PGPASSWORD", "PGSSLPASSWORD"} {
		add(e.get(name))
	}
	if cfg, err := pgconn.ParseConfig(cs); err == nil {
		add(cfg.Password)
	}
	// Decoded forms too: pgx and the server quote what they decoded.
	for _, h := range slices.Clone(hidden) {
		if d, err := url.PathUnescape(h); err == nil {
			add(d)
		}
	}
	slices.SortFunc(hidden, func(a, b string) int { return len(b) - len(a) })
	return hidden
}

// minSecret is the length from which a secret is replaced in a message
// (shorter ones would garble ordinary words), and the length of the runs of
// a secret that make a message be replaced by a generic one.
const (
	minSecret = 3
	minRun    = 4
)

// scrubText replaces each secret (of minSecret bytes or more) in msg, and
// each quoted piece of msg that overlaps one (see scrubQuoted), by xxxxx.
// It reports false if the text left still shares minRun bytes in a
// row with a secret: a part of one (a password's tail the server named as
// a parameter), which the caller must not show.
func scrubText(msg string, hidden []string) (string, bool) {
	return scrubAtLeast(msg, hidden, minSecret)
}

// scrubAtLeast is scrubText for secrets of at least n bytes (a parse
// error's reason, which quotes only the settings, hides every secret).
func scrubAtLeast(msg string, hidden []string, n int) (string, bool) {
	var long []string
	for _, h := range hidden {
		if len(h) >= n {
			msg = strings.ReplaceAll(msg, h, "xxxxx")
			long = append(long, h)
		}
	}
	msg = scrubQuoted(msg, long)
	// pgxlock's own texts (xxxxx, the parse error's stand-in reason) are
	// no part of a secret, whatever bytes they share with one.
	rest := strings.NewReplacer("xxxxx", "\x00", reasonHidden, "\x00").Replace(msg)
	for _, h := range hidden {
		if len(h) >= minRun && sharesRun(rest, h, minRun) {
			return msg, false
		}
	}
	return msg, true
}

// hiddenError is the text shown for an error whose message may quote part
// of a password: its class, without the text (which quotes the settings).
func hiddenError(err error) string {
	const why = "the error text is not shown, as it may quote part of a secret in the connection settings"
	var pe *pgconn.PgError
	hasPg := errors.As(err, &pe)
	var ce *pgconn.ConnectError
	var code string
	if hasPg && isSQLState(pe.Code) {
		code = " (SQLSTATE " + pe.Code + ")"
	}
	switch {
	case errors.Is(err, errSettings):
		return errSettings.Error() + " (" + why + ")"
	case errors.As(err, &ce), strings.HasPrefix(err.Error(), "connect:"):
		if hasPg {
			return "connect: the server refused the connection" + code + " (" + why + ")"
		}
		return "connect: failed to connect (" + why + ")"
	case hasPg:
		return "server error" + code + " (" + why + ")"
	default:
		return "error (" + why + ")"
	}
}

// isSQLState reports whether c looks like a SQLSTATE (5 digits or upper-case
// letters), which is then safe to show.
func isSQLState(c string) bool {
	if len(c) != 5 {
		return false
	}
	for i := 0; i < len(c); i++ {
		if !('0' <= c[i] && c[i] <= '9' || 'A' <= c[i] && c[i] <= 'Z') {
			return false
		}
	}
	return true
}

// scrubArg is a message argument with the secrets scrubbed from its text:
// an error that still shares a run with one becomes hiddenError, any other
// text with such a run becomes xxxxx. Numbers and other values that are not
// text are kept.
func scrubArg(a any, hidden []string) any {
	var text string
	switch v := a.(type) {
	case error:
		text = v.Error()
		if t, ok := scrubText(text, hidden); ok {
			return t
		}
		return hiddenError(v)
	case string:
		text = v
	case fmt.Stringer:
		text = v.String()
	default:
		return a
	}
	if t, ok := scrubText(text, hidden); ok {
		return t
	}
	return "xxxxx"
}

// msgf prints a message of pgxlock's own through safeText, with the
// secrets of the invocation's connection settings scrubbed from its
// arguments (see scrubArg) and then from the whole text. Never for the
// command's output, which `run` passes through as it is.
func (s stdio) msgf(w io.Writer, format string, a ...any) {
	var hidden []string
	if s.hide != nil {
		hidden = s.hide()
	}
	if len(hidden) == 0 {
		msgf(w, format, a...)
		return
	}
	args := make([]any, len(a))
	for i, v := range a {
		args[i] = scrubArg(v, hidden)
	}
	text, _ := scrubText(fmt.Sprintf(format, args...), hidden)
	fmt.Fprint(w, safeText(text))
}

// scrubQuoted replaces each "quoted" or `quoted` piece of msg that overlaps
// a hidden text with "xxxxx".
func scrubQuoted(msg string, hidden []string) string {
	var b strings.Builder
	for i := 0; i < len(msg); {
		q := msg[i]
		if q != '"' && q != '`' {
			b.WriteByte(q)
			i++
			continue
		}
		j := i + 1
		for j < len(msg) && msg[j] != q {
			if q == '"' && msg[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(msg) { // no closing quote: the rest is the piece
			j = len(msg)
		}
		piece := msg[i+1 : min(j, len(msg))]
		if revealsHidden(piece, hidden) {
			b.WriteString(string(q) + "xxxxx" + string(q))
		} else {
			b.WriteString(msg[i:min(j+1, len(msg))])
		}
		i = j + 1
	}
	return b.String()
}

// revealsHidden reports whether a quoted piece of an error message (as
// written, or unquoted in Go syntax) overlaps any of hidden: it holds one of
// them, is a part of one (two bytes or more: a single character such as
// the "=" of `missing "=" after` tells nothing), or shares four bytes in a
// row with one.
func revealsHidden(piece string, hidden []string) bool {
	forms := []string{piece}
	if u, err := strconv.Unquote(`"` + piece + `"`); err == nil && u != piece {
		forms = append(forms, u)
	}
	for _, f := range forms {
		for _, h := range hidden {
			if h == "" {
				continue
			}
			if strings.Contains(f, h) || (len(f) >= 2 && strings.Contains(h, f)) || sharesRun(f, h, 4) {
				return true
			}
		}
	}
	return false
}

// sharesRun reports whether s contains any n bytes in a row of h.
func sharesRun(s, h string, n int) bool {
	for i := 0; i+n <= len(h); i++ {
		if strings.Contains(s, h[i:i+n]) {
			return true
		}
	}
	return false
}
