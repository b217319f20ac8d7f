package keys

import (
	"fmt"
	"strconv"
	"sync"
)

// maxNameLen bounds a namespace name; names are labels for logs.
const maxNameLen = 64

// Namespace is a registered int32 with a name. It owns the SpacePair keys
// whose first number is its id (see Namespace.Key) and a domain-separated
// slice of the SpaceInt64 hash space (see Namespace.Hash).
//
// Obtain a Namespace from RegisterNamespace, MustRegisterNamespace or
// LookupNamespace. The zero Namespace is not registered: its Key method
// returns the zero Key and its Hash method returns ErrInvalid.
type Namespace struct {
	id   int32
	name string
}

// registry is the process-wide set of namespaces. It only grows: a
// registration is never removed, so a Namespace value stays valid forever.
var registry = struct {
	mu     sync.RWMutex
	byID   map[int32]Namespace
	byName map[string]int32
}{
	byID:   map[int32]Namespace{},
	byName: map[string]int32{},
}

// RegisterNamespace records that id is called name in this process and
// returns the Namespace.
//
// Registering the same (id, name) again returns the same Namespace and a nil
// error, so independent packages may both declare a namespace they share.
// An id already registered under another name, or a name already registered
// with another id, returns ErrNamespaceConflict: both would make logs
// ambiguous, and the first usually means two features are about to share
// locks by accident. The registry is per process; it cannot see other
// services using the same database, so assign ids in one place.
//
// name must be 1 to 64 bytes of ASCII letters, digits, '_', '-' and '.';
// anything else returns ErrInvalid. The name is only a label: keys derive
// from the id, so renaming a namespace does not change its keys.
func RegisterNamespace(id int32, name string) (Namespace, error) {
	if err := validateName(name); err != nil {
		return Namespace{}, err
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if ns, ok := registry.byID[id]; ok {
		if ns.name == name {
			return ns, nil
		}
		return Namespace{}, fmt.Errorf("%w: id %d is already registered as %q, not %q",
			ErrNamespaceConflict, id, ns.name, name)
	}
	if other, ok := registry.byName[name]; ok {
		return Namespace{}, fmt.Errorf("%w: name %q is already registered with id %d, not %d",
			ErrNamespaceConflict, name, other, id)
	}
	ns := Namespace{id: id, name: name}
	registry.byID[id] = ns
	registry.byName[name] = id
	return ns, nil
}

// MustRegisterNamespace is RegisterNamespace for package-level variables:
//
//	var billing = keys.MustRegisterNamespace(7, "billing")
//
// It panics with the error (wrapping ErrInvalid or ErrNamespaceConflict) when
// RegisterNamespace would return one. It is the only function in this
// package that panics.
func MustRegisterNamespace(id int32, name string) Namespace {
	ns, err := RegisterNamespace(id, name)
	if err != nil {
		panic(err)
	}
	return ns
}

// LookupNamespace returns the namespace registered with id, if any.
func LookupNamespace(id int32) (Namespace, bool) {
	registry.mu.RLock()
	ns, ok := registry.byID[id]
	registry.mu.RUnlock()
	return ns, ok
}

func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty namespace name", ErrInvalid)
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("%w: namespace name is %d bytes, more than %d", ErrInvalid, len(name), maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.':
		default:
			// %q of the whole name is safe to show: it is a label, not data.
			return fmt.Errorf("%w: namespace name %q has byte %q at offset %d; allowed are ASCII letters, digits, '_', '-', '.'",
				ErrInvalid, name, c, i)
		}
	}
	return nil
}

// ID returns the namespace's id: the first int4 of its pair keys.
func (n Namespace) ID() int32 { return n.id }

// Name returns the registered name; "" for the zero Namespace.
func (n Namespace) Name() string { return n.name }

// String returns "ns:NAME(ID)", e.g. "ns:billing(7)"; "ns:<zero>" for the
// zero Namespace.
func (n Namespace) String() string {
	if n.name == "" {
		return "ns:<zero>"
	}
	return "ns:" + n.name + "(" + strconv.FormatInt(int64(n.id), 10) + ")"
}

// Key returns the exact SpacePair key Pair(n.ID(), id). Distinct ids give
// distinct keys, and FromPgLocks decodes the key back, so the namespace and id
// can be read from pg_locks. For the zero Namespace it returns the zero Key.
func (n Namespace) Key(id int32) Key {
	if n.name == "" {
		return Key{}
	}
	return Pair(n.id, id)
}

// Hash returns a SpaceInt64 key for s within the namespace: the first 8 bytes,
// big-endian signed, of SHA-256 over
//
//	"pgxlock:v1" | 0x00 | ID as 4 bytes, big-endian two's complement | 0x00 | s
//
// The name is not hashed, so renaming a namespace keeps its keys. The key
// does not keep s, and its String shows only the number.
//
// It returns ErrInvalid for an empty s (almost always a missing value, not a
// resource) and for the zero Namespace.
func (n Namespace) Hash(s string) (Key, error) {
	if n.name == "" {
		return Key{}, fmt.Errorf("%w: Hash on the zero Namespace", ErrInvalid)
	}
	if s == "" {
		return Key{}, fmt.Errorf("%w: empty string for namespace %s", ErrInvalid, n)
	}
	return Int64(nsHashInt64(n.id, s)), nil
}

// NamespaceLabel names the registered namespace that the keys of one call
// share, for metrics and traces: the namespace's name when every key is a
// pair whose first int is that registered namespace, "none" when no key is
// (or ks is empty), and "mixed" when the keys disagree. It never shows a
// key's value.
func NamespaceLabel(ks []Key) string {
	label := ""
	for _, k := range ks {
		name := "none"
		if a, _, ok := k.Pair(); ok {
			if ns, ok := LookupNamespace(a); ok {
				name = ns.Name()
			}
		}
		switch {
		case label == "":
			label = name
		case label != name:
			return "mixed"
		}
	}
	if label == "" {
		return "none"
	}
	return label
}
