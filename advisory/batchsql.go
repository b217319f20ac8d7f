package advisory

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// endsTransaction reports the first statement of b that would begin or end
// a transaction (BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK without
// TO, ABORT, PREPARE TRANSACTION), and the command word it starts with.
// WithXactLockBatch refuses such a batch before sending anything: a COMMIT
// among b's statements would release the keys and keep the statements
// before it whatever happened after, so neither "all or nothing" nor "the
// keys are held while b runs" would hold. Each queued SQL string is split
// on the semicolons that separate statements (outside quotes, dollar
// quotes and comments), since pgx may send a string of several statements
// in the simple protocol. SAVEPOINT, RELEASE and ROLLBACK TO SAVEPOINT are
// allowed: they stay inside the call's transaction, and the keys, taken
// before any savepoint of b, are not released by them.
func endsTransaction(b *pgx.Batch) (index int, word string, found bool) {
	for i, q := range b.QueuedQueries {
		if w, ok := sqlEndsTransaction(q.SQL); ok {
			return i, w, true
		}
	}
	return 0, "", false
}

// sqlEndsTransaction applies the rule of endsTransaction to one SQL string.
func sqlEndsTransaction(sql string) (string, bool) {
	for stmt := range splitStatements(sql) {
		w1, rest := firstWord(stmt)
		switch w1 {
		case "BEGIN", "START", "COMMIT", "END", "ABORT":
			return w1, true
		case "ROLLBACK":
			if w2, _ := firstWord(rest); w2 != "TO" {
				return w1, true
			}
		case "PREPARE":
			if w2, _ := firstWord(rest); w2 == "TRANSACTION" {
				return w1 + " TRANSACTION", true
			}
		}
	}
	return "", false
}

// splitStatements yields the statements of sql, separated by semicolons
// outside single-quoted strings (with E'...' escapes), quoted
// identifiers, dollar-quoted strings and comments. Comments are kept in the
// pieces; firstWord skips them.
func splitStatements(sql string) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		start := 0
		for i := 0; i < len(sql); {
			switch c := sql[i]; {
			case c == ';':
				if !yield(sql[start:i]) {
					return
				}
				i++
				start = i
			case c == '\'' || c == '"':
				i = skipQuoted(sql, i, c, c == '\'' && i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e'))
			case c == '-' && strings.HasPrefix(sql[i:], "--"):
				i = skipLineComment(sql, i)
			case c == '/' && strings.HasPrefix(sql[i:], "/*"):
				i = skipBlockComment(sql, i)
			case c == '$':
				i = skipDollarQuoted(sql, i)
			default:
				i++
			}
		}
		yield(sql[start:])
	}
}

// skipQuoted returns the index after the literal or identifier opened by q
// at sql[i]. A doubled quote stays inside; so does a backslash-escaped one
// in an E'...' string (escapes). Ordinary strings follow
// standard_conforming_strings = on, PostgreSQL's default since 9.1, where a
// backslash is an ordinary character.
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for i++; i < len(sql); i++ {
		switch sql[i] {
		case '\\':
			if escapes {
				i++
			}
		case q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(sql)
}

func skipLineComment(sql string, i int) int {
	if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(sql)
}

// skipBlockComment skips a /* */ comment; PostgreSQL's nest.
func skipBlockComment(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case strings.HasPrefix(sql[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(sql[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(sql)
}

// skipDollarQuoted skips $tag$...$tag$ starting at sql[i] == '$'; a '$' that
// opens no tag (a parameter such as $1) is skipped alone.
func skipDollarQuoted(sql string, i int) int {
	j := i + 1
	for j < len(sql) && (isIdentByte(sql[j]) && !(j == i+1 && sql[j] >= '0' && sql[j] <= '9')) {
		j++
	}
	if j >= len(sql) || sql[j] != '$' {
		return i + 1
	}
	tag := sql[i : j+1]
	if k := strings.Index(sql[j+1:], tag); k >= 0 {
		return j + 1 + k + len(tag)
	}
	return len(sql)
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// firstWord returns the first keyword of s in upper case (after spaces and
// comments) and the rest of s after it.
func firstWord(s string) (string, string) {
	i := 0
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '(':
			i++
		case strings.HasPrefix(s[i:], "--"):
			i = skipLineComment(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = skipBlockComment(s, i)
		default:
			j := i
			for j < len(s) && isIdentByte(s[j]) {
				j++
			}
			return strings.ToUpper(s[i:j]), s[j:]
		}
	}
	return "", ""
}
