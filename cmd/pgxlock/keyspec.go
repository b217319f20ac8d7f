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
	reInt  = regexp.MustCompile(`^\s*[+-]?[0-9]+\s*$`)
	rePair = regexp.MustCompile(`^\s*([+-]?[0-9]+)\s*,\s*([+-]?[0-9]+)\s*$`)
	// ns:NAME(ID)/REST or ns:NAME/REST; NAME as keys.RegisterNamespace allows.
	reNS = regexp.MustCompile(`^ns:([A-Za-z0-9_.-]+)(?:\((-?[0-9]+)\))?/(.*)$`)
)

// parseKey turns the key syntax of `pgxlock help` into a key. Errors wrap
// errKeySyntax and quote the input: it is what the user typed.
func (n namespaces) parseKey(s string) (keys.Key, error) {
	k, err := n.parseKey1(s)
	if err != nil {
		return keys.Key{}, fmt.Errorf("%w %q: %v", errKeySyntax, s, err)
	}
	return k, nil
}

func (n namespaces) parseKey1(s string) (keys.Key, error) {
	switch {
	case s == "":
		return keys.Key{}, errors.New("empty (write hash: for the hash of the empty string)")
	case strings.HasPrefix(s, "hash:"):
		return keys.Hash(strings.TrimPrefix(s, "hash:")), nil
	case strings.HasPrefix(s, "int64:"):
		return parseInt64(strings.TrimPrefix(s, "int64:"))
	case strings.HasPrefix(s, "pair:"):
		m := rePair.FindStringSubmatch(strings.TrimPrefix(s, "pair:"))
		if m == nil {
			return keys.Key{}, errors.New("want pair:A,B with two int4 numbers")
		}
		return parsePair(m[1], m[2])
	case strings.HasPrefix(s, "ns:"):
		return n.parseNS(s)
	case rePair.MatchString(s):
		m := rePair.FindStringSubmatch(s)
		return parsePair(m[1], m[2])
	case reInt.MatchString(s):
		return parseInt64(s)
	default:
		return keys.Hash(s), nil
	}
}

func parseInt64(s string) (keys.Key, error) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
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
// ns:NAME/hash:S.
func (n namespaces) parseNS(s string) (keys.Key, error) {
	m := reNS.FindStringSubmatch(s)
	if m == nil {
		return keys.Key{}, errors.New("want ns:NAME/ID, ns:NAME(NSID)/ID or ns:NAME/hash:STRING")
	}
	name, idText, rest := m[1], m[2], m[3]
	var ns keys.Namespace
	if idText != "" {
		id, err := strconv.ParseInt(idText, 10, 32)
		if err != nil {
			return keys.Key{}, errors.New("the namespace id must be an int4")
		}
		if ns, err = n.add(name, int32(id)); err != nil {
			return keys.Key{}, err
		}
	} else {
		var ok bool
		if ns, ok = n[name]; !ok {
			return keys.Key{}, fmt.Errorf("unknown namespace %q: write ns:%s(ID)/..., or give --ns %s=ID or %s", name, name, name, envNamespaces)
		}
	}
	if s, ok := strings.CutPrefix(rest, "hash:"); ok {
		return ns.Hash(s)
	}
	id, err := strconv.ParseInt(rest, 10, 32)
	if err != nil {
		return keys.Key{}, errors.New("the id after the namespace must be an int4, or hash:STRING")
	}
	return ns.Key(int32(id)), nil
}
