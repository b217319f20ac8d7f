package main

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/pgxlock/pgxlock/keys"
)

// envNamespaces names the environment variable with namespace names:
// "billing=7,jobs=8".
const envNamespaces = "PGXLOCK_NAMESPACES"

// errKeySyntax marks every key-parsing error (a usage error).
var errKeySyntax = errors.New("bad key")

// namespaces are the namespace names one invocation knows, from --ns flags,
// PGXLOCK_NAMESPACES and ns:NAME(ID) keys. Each is also registered with package
// keys, which is what makes advisory.ListLocks and keys.Key.String show the
// name. The keys registry is process-wide and append-only; the map is this
// invocation's view of it (keys has no lookup by name).
type namespaces map[string]keys.Namespace

// add registers name=id. A name or id registered before with another
// partner is an error (keys.ErrNamespaceConflict).
func (n namespaces) add(name string, id int32) (keys.Namespace, error) {
	ns, err := keys.RegisterNamespace(id, name)
	if err != nil {
		return keys.Namespace{}, err
	}
	n[name] = ns
	return ns, nil
}

// addList registers a comma-separated list of NAME=ID.
func (n namespaces) addList(list string) error {
	for item := range strings.SplitSeq(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, idText, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("namespace %q: want NAME=ID", item)
		}
		id, err := strconv.ParseInt(strings.TrimSpace(idText), 10, 32)
		if err != nil {
			return fmt.Errorf("namespace %q: the id must be an int4 (%d..%d)", item, int32(-1<<31), int32(1<<31-1))
		}
		if _, err := n.add(strings.TrimSpace(name), int32(id)); err != nil {
			return err
		}
	}
	return nil
}

// nsFlag is the repeatable --ns NAME=ID flag.
type nsFlag struct{ n namespaces }

func (f nsFlag) String() string { return "" }
func (f nsFlag) Set(v string) error {
	return f.n.addList(v)
}

// keyList is the repeatable --key flag of `locks`; keys are parsed after all
// flags, so that --ns may come after --key.
type keyList []string

func (k *keyList) String() string     { return strings.Join(*k, " ") }
func (k *keyList) Set(v string) error { *k = append(*k, v); return nil }

var (
	// Numbers are decimal, optionally signed, with nothing around them.
	reInt  = regexp.MustCompile(`^[+-]?[0-9]+$`)
	rePair = regexp.MustCompile(`^([+-]?[0-9]+),([+-]?[0-9]+)$`)
	// ns:NAME(ID)/REST or ns:NAME/REST; NAME as keys.RegisterNamespace allows.
	reNS = regexp.MustCompile(`^ns:([A-Za-z0-9_.-]+)(?:\(([+-]?[0-9]+)\))?/(.*)$`)
	// A word and a colon at the start: a prefix, known or not.
	rePrefix = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9_-]*):`)
)

// keyForms is shown with every key error: the accepted forms, in short.
const keyForms = `accepted forms: 123 | 7,42 | int64:123 | pair:7,42 | ns:NAME(ID)/42 | ns:NAME/42 | ns:NAME/hash:TEXT | hash:TEXT | TEXT (hashed; see "pgxlock help")`

// parseKey turns the key syntax of `pgxlock help` into a key, and reports
// whether the key was derived by hashing a string (the caller says so on
// stderr: a typo in a string key silently names another lock otherwise).
// Errors wrap errKeySyntax, quote the input (it is what the user typed) and
// list the accepted forms.
func (n namespaces) parseKey(s string) (k keys.Key, hashed bool, err error) {
	k, hashed, err = n.parseKey1(s)
	if err != nil {
		return keys.Key{}, false, fmt.Errorf("%w %q: %v\n%s", errKeySyntax, s, err, keyForms)
	}
	return k, hashed, nil
}

func (n namespaces) parseKey1(s string) (keys.Key, bool, error) {
	if s == "" {
		return keys.Key{}, false, errors.New("empty (write hash: for the hash of the empty string)")
	}
	if rest, ok := strings.CutPrefix(s, "hash:"); ok {
		return keys.Hash(rest), true, nil // exactly what follows, spaces included
	}
	if strings.TrimSpace(s) != s {
		return keys.Key{}, false, errors.New("leading or trailing white space (write hash:... to hash a string that has it)")
	}
	if m := rePrefix.FindStringSubmatch(s); m != nil {
		switch m[1] {
		case "int64":
			k, err := parseInt64(strings.TrimPrefix(s, "int64:"))
			return k, false, err
		case "pair":
			m := rePair.FindStringSubmatch(strings.TrimPrefix(s, "pair:"))
			if m == nil {
				return keys.Key{}, false, errors.New("want pair:A,B with two decimal int4 numbers and no spaces")
			}
			k, err := parsePair(m[1], m[2])
			return k, false, err
		case "ns":
			return n.parseNS(s)
		}
		// INT64:5, Hash:x, int:5, tenant:acme: a mistyped prefix, or a string
		// with a colon; either way the user must say which.
		return keys.Key{}, false, fmt.Errorf("unknown prefix %q (prefixes are lower case: int64:, pair:, ns:, hash:; to hash a string that has a colon, write hash:%s)", m[1]+":", s)
	}
	if m := rePair.FindStringSubmatch(s); m != nil {
		k, err := parsePair(m[1], m[2])
		return k, false, err
	}
	if reInt.MatchString(s) {
		k, err := parseInt64(s)
		return k, false, err
	}
	if c := s[0]; c == '+' || c == '-' || c == '.' || (c >= '0' && c <= '9') {
		// 1,2,3  1e3  0x7b  1_000  1.5  7,  12a: a mistyped number, not a name.
		return keys.Key{}, false, errors.New("looks like a number but is not one: a key number is decimal, a pair is A,B with no spaces (write hash:... to hash this string)")
	}
	return keys.Hash(s), true, nil
}

func parseInt64(s string) (keys.Key, error) {
	if !reInt.MatchString(s) {
		return keys.Key{}, errors.New("not a decimal bigint")
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return keys.Key{}, errors.New("not a bigint (-9223372036854775808..9223372036854775807)")
	}
	return keys.Int64(v), nil
}

func parsePair(a, b string) (keys.Key, error) {
	x, errA := strconv.ParseInt(a, 10, 32)
	y, errB := strconv.ParseInt(b, 10, 32)
	if errA != nil || errB != nil {
		return keys.Key{}, errors.New("a pair needs two int4 numbers (-2147483648..2147483647)")
	}
	return keys.Pair(int32(x), int32(y)), nil
}

// parseNS handles ns:NAME(ID)/N, ns:NAME/N, ns:NAME(ID)/hash:S and
// ns:NAME/hash:S; hashed reports the hash:S forms.
func (n namespaces) parseNS(s string) (k keys.Key, hashed bool, err error) {
	m := reNS.FindStringSubmatch(s)
	if m == nil {
		return keys.Key{}, false, errors.New("want ns:NAME/ID, ns:NAME(NSID)/ID or ns:NAME/hash:STRING")
	}
	name, idText, rest := m[1], m[2], m[3]
	var ns keys.Namespace
	if idText != "" {
		id, err := strconv.ParseInt(idText, 10, 32)
		if err != nil {
			return keys.Key{}, false, errors.New("the namespace id must be an int4")
		}
		if ns, err = n.add(name, int32(id)); err != nil {
			return keys.Key{}, false, err
		}
	} else {
		var ok bool
		if ns, ok = n[name]; !ok {
			return keys.Key{}, false, fmt.Errorf("unknown namespace %q: write ns:%s(ID)/..., or give --ns %s=ID or %s", name, name, name, envNamespaces)
		}
	}
	if s, ok := strings.CutPrefix(rest, "hash:"); ok {
		k, err := ns.Hash(s)
		return k, true, err
	}
	if !reInt.MatchString(rest) {
		return keys.Key{}, false, errors.New("the id after the namespace must be a decimal int4, or hash:STRING")
	}
	id, err := strconv.ParseInt(rest, 10, 32)
	if err != nil {
		return keys.Key{}, false, errors.New("the id after the namespace must be an int4 (-2147483648..2147483647)")
	}
	return ns.Key(int32(id)), false, nil
}

// hashNote is what `run` and `locks` print on stderr whenever a key was
// derived by hashing a string, so that a typo in it cannot silently name
// another lock. It shows the key, never the string (see "Key syntax").
func hashNote(cmd string, k keys.Key) string {
	return fmt.Sprintf("pgxlock %s: --key is a hashed string: %s\n", cmd, k)
}
