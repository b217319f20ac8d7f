package advisory

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// This file holds the check WithXactLockBatch makes before it sends a
// caller's batch: no statement of it may begin, end or leave the call's
// transaction, since a COMMIT among them would release the keys and keep
// the statements before it whatever happened after.
//
// The check depends on how pgx sends the batch, which the connection's
// DefaultQueryExecMode decides:
//
//   - Every mode but QueryExecModeSimpleProtocol uses the extended
//     protocol: each queued SQL string travels in a Parse message of its
//     own, and PostgreSQL refuses a Parse that holds more than one statement
//     (SQLSTATE 42601, "cannot insert multiple commands into a prepared
//     statement"), so each string is at most one statement, whatever its
//     quotes or comments. Only its leading keywords, after white space,
//     comments and semicolons, need reading, and a first word that starts
//     no statement is refused: pgx looks the string up among the
//     statements prepared with pgx.Conn.Prepare first, and sends the one of
//     that name in its place.
//   - QueryExecModeSimpleProtocol joins the batch's strings with "\n;"
//     (pgx v5 conn.go, sendBatchQueryExecModeSimpleProtocol), after
//     substituting the arguments into each, and sends them as one Query
//     message: PostgreSQL splits that text into statements with its own
//     lexer, so the check lexes each string as PostgreSQL does (see
//     simpleRefusal) and refuses what it cannot read for sure.
//
// In both, a string is checked as pgx will send it: a pgx.QueryRewriter
// given as its first arguments (pgx.NamedArgs, for example) is applied
// first.

// refusedStatement is the reason for refusing one statement of a batch
// whose text is stmt (leading white space and comments included), or ""
// when stmt stays inside the call's transaction. Refused: BEGIN, START
// (TRANSACTION), COMMIT (AND CHAIN, PREPARED), END, ABORT, ROLLBACK (AND
// CHAIN, PREPARED) unless it is ROLLBACK [WORK | TRANSACTION] TO, and
// PREPARE TRANSACTION. SAVEPOINT, RELEASE [SAVEPOINT] and ROLLBACK [WORK |
// TRANSACTION] TO [SAVEPOINT] stay inside the call's transaction, and the
// keys, taken before any savepoint of the batch, are not released by them.
// Other statements cannot end a transaction block they run in: those that
// may not run in one (VACUUM, CREATE DATABASE, ...) fail, and so does a
// COMMIT or ROLLBACK run by a procedure or a DO block (SQLSTATE 2D000,
// invalid transaction termination), rolling everything back.
//
// Leading semicolons are skipped: PostgreSQL drops empty statements, so
// that a Parse of "; COMMIT" holds one statement, a COMMIT.
func refusedStatement(stmt string) string {
	w1, rest := leadingWord(stmt)
	switch w1 {
	case "BEGIN", "START", "COMMIT", "END", "ABORT":
		return w1
	case "ROLLBACK":
		w2, rest := firstWord(rest)
		if w2 == "WORK" || w2 == "TRANSACTION" {
			w2, _ = firstWord(rest)
		}
		if w2 != "TO" {
			return w1
		}
	case "PREPARE":
		if w2, _ := firstWord(rest); w2 == "TRANSACTION" {
			return "PREPARE TRANSACTION"
		}
	}
	return ""
}

// checkBatch returns copies of b's queued queries as pgx will send them on
// conn, each QueryRewriter applied (and dropped from the arguments), and
// the position in b of the first string that would begin, end or leave
// the call's transaction, or that the check cannot read for sure, and why;
// found is false when there is none. It sends nothing. ctx and conn are
// handed to the QueryRewriters, each called once: the copies are what the
// call sends.
func checkBatch(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) (checked []pgx.QueuedQuery, index int, reason string, found bool) {
	simple := conn.Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol
	checked = make([]pgx.QueuedQuery, len(b.QueuedQueries))
	for i, q := range b.QueuedQueries {
		// A fresh copy: pgx keeps in a QueuedQuery the statement it described
		// when the batch was last sent, and would run that instead of SQL.
		checked[i] = pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn}
		sql, args := q.SQL, q.Arguments
		// As pgx's sendBatch: leading QueryRewriters are options; the
		// last one rewrites.
		var rw pgx.QueryRewriter
		for len(args) > 0 {
			r, ok := args[0].(pgx.QueryRewriter)
			if !ok {
				break
			}
			rw, args = r, args[1:]
		}
		if rw != nil {
			var err error
			if sql, args, err = rw.RewriteQuery(ctx, conn, sql, args); err != nil {
				return nil, i, fmt.Sprintf("its QueryRewriter failed: %v", err), true
			}
		}
		checked[i].SQL, checked[i].Arguments = sql, args
		if len(args) > 0 {
			if _, ok := args[0].(pgx.QueryRewriter); ok {
				// pgx would rewrite again, with what the check never read.
				return nil, i, "a QueryRewriter among the rewritten arguments", true
			}
		}
		if sql == "" {
			// pgx's statement caches cannot hold it: they panic.
			return nil, i, "an empty string", true
		}
		if r := refusal(sql, len(args), simple); r != "" {
			return nil, i, r, true
		}
	}
	return checked, 0, "", false
}

// statementWords are the words a PostgreSQL statement can begin with (the
// SQL Commands of its manual; a statement can also begin with a
// parenthesis).
var statementWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`ABORT ALTER ANALYSE ANALYZE BEGIN CALL CHECKPOINT CLOSE CLUSTER
		COMMENT COMMIT COPY CREATE DEALLOCATE DECLARE DELETE DISCARD DO DROP END EXECUTE EXPLAIN FETCH
		GRANT IMPORT INSERT LISTEN LOAD LOCK MERGE MOVE NOTIFY PREPARE REASSIGN REFRESH REINDEX RELEASE
		RESET REVOKE ROLLBACK SAVEPOINT SECURITY SELECT SET SHOW START TABLE TRUNCATE UNLISTEN UPDATE
		VACUUM VALUES WITH`) {
		statementWords[w] = true
	}
}

// refusal is checkBatch's rule for one SQL string (as pgx will send it,
// with nargs arguments), sent in the simple
// protocol or in the extended one: "" when it is fine.
func refusal(sql string, nargs int, simple bool) string {
	if simple {
		return simpleRefusal(sql, nargs)
	}
	if w := refusedStatement(sql); w != "" {
		return "it begins or ends a transaction (" + w + ")"
	}
	// pgx's extended modes run the statement prepared (pgx.Conn.Prepare)
	// under the name sql, if any, instead of sql: one whose text the
	// check cannot see. Only a string that starts as a statement does, or
	// holds nothing but white space, comments and semicolons, is sent.
	if w, rest := leadingWord(sql); w == "" && rest != "" && rest[0] != '(' || w != "" && !statementWords[w] {
		return "it does not start as a PostgreSQL statement does: pgx would run the statement prepared under that name, if any, which the check cannot read"
	}
	return ""
}

// simpleRefusal is the rule for a string sent in the simple protocol. It
// lexes sql as PostgreSQL's scanner does (scan.l) with
// standard_conforming_strings on, the only setting pgx's simple protocol
// accepts, and applies refusedStatement to every statement, that is to the
// text after each semicolon that stands outside literals, quoted
// identifiers, dollar quotes and comments. A line comment (--) ends at a
// line feed or a carriage return; /* */ comments nest; '...' strings double
// their quotes, and so do B'...', X'...', N'...' and U&'...' ones; an
// E'...' string (E standing alone, not the end of an identifier such as
// name'...') also takes backslash escapes, and one continued on a
// following line ('a' newline 'b') stays an E'...' string; a dollar quote
// opens where a token starts ($tag$, the tag not starting with a digit),
// not inside an identifier (x$a$ is one identifier: PostgreSQL lets $
// follow the first character of one). It also refuses a string that it
// cannot be sure to read as PostgreSQL will, whatever its version:
//   - a literal, quoted identifier, dollar quote or /* comment left open at
//     its end, which would go on into the next string of the batch (a line
//     comment is fine: pgx's "\n" ends it);
//   - a number or a $n parameter directly followed by a letter or an
//     underscore (1e'x', 1_000, 0x1F, $1abc): versions of PostgreSQL
//     disagree on where such a token ends;
//   - $n parameters that do not match the arguments (one beyond them, an
//     argument unused, any with no arguments): pgx fails such a string
//     before sending anything, which the call could not tell from a
//     pipeline sent and unanswered;
//   - with arguments, a $n that PostgreSQL does not read as a parameter (in
//     a literal, quoted identifier, dollar quote, comment or identifier), or
//     a parameter that follows a string literal with only white space or
//     line comments between: pgx substitutes the argument's literal with a
//     lexer of its own, which may disagree, and the literal could continue
//     that string.
//
// It does not refuse statements that PostgreSQL's grammar fails: in the
// simple protocol PostgreSQL parses the whole text before running any of
// it, so such a batch runs nothing.
func simpleRefusal(sql string, nargs int) string {
	hasArgs := nargs > 0
	l := lexer{s: sql}
	stmt := 0
	check := func(end int) string {
		if w := refusedStatement(sql[stmt:end]); w != "" {
			return "it begins or ends a transaction (" + w + ")"
		}
		return ""
	}
	for l.i < len(sql) {
		if sql[l.i] == ';' {
			if r := check(l.i); r != "" {
				return r
			}
			l.i++
			l.afterString = false
			stmt = l.i
			continue
		}
		if r := l.token(hasArgs); r != "" {
			return r
		}
	}
	if r := check(len(sql)); r != "" {
		return r
	}
	// pgx fails a string whose parameters and arguments do not match, and
	// so early that the call could not tell that nothing was sent.
	if nargs == 0 && len(l.nums) > 0 {
		return fmt.Sprintf("$%d and no arguments: pgx refuses it", l.nums[0])
	}
	used := make([]bool, nargs)
	for _, n := range l.nums {
		if n < 1 || n > nargs {
			return fmt.Sprintf("$%d and %d arguments: pgx refuses it", n, nargs)
		}
		used[n-1] = true
	}
	for i, u := range used {
		if !u {
			return fmt.Sprintf("argument %d unused: pgx refuses it", i+1)
		}
	}
	if hasArgs {
		// Every "$<digit>" must be one of the parameters the lexer saw.
		for i := 0; i < len(sql); i++ {
			if sql[i] == '$' && i+1 < len(sql) && isDigit(sql[i+1]) && !l.params[i] {
				return "with arguments, a $n that PostgreSQL does not read as a parameter (in a literal, quoted identifier, comment or identifier) is refused in the simple protocol: pgx may substitute it"
			}
		}
	}
	return ""
}

// lexer walks a string as PostgreSQL's scanner does in its initial state,
// one token at a time (see simpleRefusal).
type lexer struct {
	s string
	i int
	// afterString: the last token was a string literal, and only white
	// space and line comments followed it.
	afterString bool
	params      map[int]bool // positions of the $n parameters read
	nums        []int        // their numbers, in order
}

// token reads the token (or white space, or comment) at l.i and returns
// "" or the reason for refusing the string.
func (l *lexer) token(hasArgs bool) string {
	s, i := l.s, l.i
	c := s[i]
	switch {
	case isSpace(c):
		l.i++
	case strings.HasPrefix(s[i:], "--"):
		l.i = skipLineComment(s, i)
	case strings.HasPrefix(s[i:], "/*"):
		j, ok := skipBlockComment(s, i)
		if !ok {
			return "an unterminated /* comment"
		}
		l.i, l.afterString = j, false
	case c == '\'' || (c == 'e' || c == 'E') && i+1 < len(s) && s[i+1] == '\'':
		escapes := c != '\''
		if escapes {
			i++
		}
		j, ok := skipString(s, i+1, escapes)
		if !ok {
			return "an unterminated literal"
		}
		l.i, l.afterString = j, true
	case c == '"':
		j, ok := skipQuotedIdent(s, i+1)
		if !ok {
			return "an unterminated quoted identifier"
		}
		l.i, l.afterString = j, false
	case c == '$' && i+1 < len(s) && isDigit(s[i+1]):
		j := i + 1
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		if j < len(s) && isIdentStart(s[j]) {
			return "a $n parameter directly followed by a letter or an underscore"
		}
		if hasArgs && l.afterString {
			return "with arguments, a $n parameter after a string literal with only white space or line comments between is refused in the simple protocol: its literal could continue that string"
		}
		if l.params == nil {
			l.params = map[int]bool{}
		}
		l.params[i] = true
		n, err := strconv.Atoi(s[i+1 : j])
		if err != nil || n > 1<<20 {
			return "a $n parameter out of range"
		}
		l.nums = append(l.nums, n)
		l.i, l.afterString = j, false
	case c == '$':
		if tag, ok := dollarTag(s, i); ok {
			k := strings.Index(s[i+len(tag):], tag)
			if k < 0 {
				return "an unterminated dollar quote"
			}
			l.i = i + len(tag) + k + len(tag)
		} else {
			l.i++ // not a token PostgreSQL accepts here: its parser fails
		}
		l.afterString = false
	case isIdentStart(c):
		j := i + 1
		for j < len(s) && isIdentCont(s[j]) {
			j++
		}
		l.i, l.afterString = j, false
	case isDigit(c) || c == '.' && i+1 < len(s) && isDigit(s[i+1]):
		j := skipNumber(s, i)
		if j < len(s) && isIdentStart(s[j]) {
			return "a number directly followed by a letter or an underscore"
		}
		l.i, l.afterString = j, false
	default:
		l.i, l.afterString = i+1, false // an operator or punctuation byte
	}
	return ""
}

// skipNumber returns the end of the number at s[i]: digits, an optional
// fraction, an optional exponent ([Ee][+-]digits, taken only whole).
func skipNumber(s string, i int) int {
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i < len(s) && s[i] == '.' && !(i+1 < len(s) && s[i+1] == '.') {
		i++
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			return j
		}
	}
	return i
}

// skipString returns the index after the literal whose body starts at
// s[i] (after its opening quote), and false when it is not closed. A
// doubled quote stays inside; with escapes (E'...'), a backslash takes the
// next byte. An E'...' string closed and followed by a quote continuation
// (white space with a newline, line comments allowed, then a quote) goes
// on as an E'...' string, as in PostgreSQL; for the other literals a
// continuation reads as a new literal of the same rules.
func skipString(s string, i int, escapes bool) (int, bool) {
	for i < len(s) {
		switch s[i] {
		case '\\':
			if escapes {
				i += 2
				continue
			}
			i++
		case '\'':
			if i+1 < len(s) && s[i+1] == '\'' {
				i += 2
				continue
			}
			if escapes {
				if j, ok := quoteContinues(s, i+1); ok {
					i = j + 1
					continue
				}
			}
			return i + 1, true
		default:
			i++
		}
	}
	return len(s), false
}

// quoteContinues reports whether s[i:] starts with PostgreSQL's
// {quotecontinue}: horizontal white space and line comments, a newline
// (\n or \r), then any white space and newline-ended line comments, then a
// quote, whose index it returns.
func quoteContinues(s string, i int) (int, bool) {
	newline := false
	for i < len(s) {
		switch c := s[i]; {
		case c == ' ' || c == '\t' || c == '\f':
			i++
		case c == '\n' || c == '\r':
			newline = true
			i++
		case c == '\v' && newline: // white space (PostgreSQL 16+), not horizontal
			i++
		case strings.HasPrefix(s[i:], "--"):
			j := strings.IndexAny(s[i:], "\n\r") // the newline that ends it counts
			if j < 0 {
				return 0, false
			}
			i += j
		case c == '\'':
			return i, newline
		default:
			return 0, false
		}
	}
	return 0, false
}

// skipQuotedIdent returns the index after the quoted identifier whose body
// starts at s[i]; a doubled quote stays inside.
func skipQuotedIdent(s string, i int) (int, bool) {
	for i < len(s) {
		if s[i] == '"' {
			if i+1 < len(s) && s[i+1] == '"' {
				i += 2
				continue
			}
			return i + 1, true
		}
		i++
	}
	return len(s), false
}

// dollarTag returns the opening delimiter ($tag$ or $$) at s[i] == '$'.
func dollarTag(s string, i int) (string, bool) {
	j := i + 1
	if j < len(s) && isIdentStart(s[j]) {
		for j++; j < len(s) && (isIdentStart(s[j]) || isDigit(s[j])); j++ {
		}
	}
	if j < len(s) && s[j] == '$' {
		return s[i : j+1], true
	}
	return "", false
}

// skipLineComment returns the index after the line comment at s[i]: it
// ends at a line feed or a carriage return, as PostgreSQL's does.
func skipLineComment(s string, i int) int {
	if j := strings.IndexAny(s[i:], "\n\r"); j >= 0 {
		return i + j + 1
	}
	return len(s)
}

// skipBlockComment returns the index after the /* */ comment at s[i] and
// whether it is closed; PostgreSQL's nest.
func skipBlockComment(s string, i int) (int, bool) {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i, true
			}
		default:
			i++
		}
	}
	return len(s), false
}

// isSpace: PostgreSQL's white space; \v since PostgreSQL 16 (earlier
// versions fail it).
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isIdentStart: PostgreSQL's ident_start, [A-Za-z\200-\377_].
func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// isIdentCont: PostgreSQL's ident_cont, ident_start plus digits and $.
func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// firstWord returns the first word of s in ASCII upper case, after white
// space and comments, and the rest of s after it; the word is "" when s
// starts with anything else (a quote, a parenthesis, nothing).
func firstWord(s string) (string, string) {
	i := 0
	for i < len(s) {
		switch {
		case isSpace(s[i]):
			i++
		case strings.HasPrefix(s[i:], "--"):
			i = skipLineComment(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i, _ = skipBlockComment(s, i)
		default:
			j := i
			for j < len(s) && isIdentCont(s[j]) {
				j++
			}
			if j == i || !isIdentStart(s[i]) {
				return "", s[i:]
			}
			return asciiUpper(s[i:j]), s[j:]
		}
	}
	return "", ""
}

// leadingWord is firstWord after any semicolons too (with the white space
// and comments around them): PostgreSQL drops empty statements.
func leadingWord(s string) (string, string) {
	w, rest := firstWord(s)
	for w == "" && strings.HasPrefix(rest, ";") {
		w, rest = firstWord(rest[1:])
	}
	return w, rest
}

// asciiUpper upper-cases ASCII letters only, as PostgreSQL folds keywords.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
