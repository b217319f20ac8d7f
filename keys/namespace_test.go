package keys_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

func TestRegisterNamespace(t *testing.T) {
	ns, err := keys.RegisterNamespace(2001, "reg-basic")
	if err != nil {
		t.Fatal(err)
	}
	if ns.ID() != 2001 || ns.Name() != "reg-basic" || ns.String() != "ns:reg-basic(2001)" {
		t.Errorf("got ID=%d Name=%q String=%q", ns.ID(), ns.Name(), ns.String())
	}
	again, err := keys.RegisterNamespace(2001, "reg-basic")
	if err != nil || again != ns {
		t.Errorf("re-registering the same (id, name) = %v, %v; want %v, nil", again, err, ns)
	}
	if got, ok := keys.LookupNamespace(2001); !ok || got != ns {
		t.Errorf("LookupNamespace(2001) = %v, %v", got, ok)
	}
	if got, ok := keys.LookupNamespace(2999); ok {
		t.Errorf("LookupNamespace(2999) = %v, true; want not found", got)
	}
}

func TestRegisterNamespaceIDConflict(t *testing.T) {
	orig := keys.MustRegisterNamespace(2002, "reg-id-a")
	ns, err := keys.RegisterNamespace(2002, "reg-id-b")
	if !errors.Is(err, keys.ErrNamespaceConflict) || ns != (keys.Namespace{}) {
		t.Fatalf("second name for id 2002 = %v, %v; want ErrNamespaceConflict", ns, err)
	}
	if got, _ := keys.LookupNamespace(2002); got != orig {
		t.Errorf("conflict changed the registration: %v", got)
	}
	// The losing name stays free for its own id.
	if _, err := keys.RegisterNamespace(2003, "reg-id-b"); err != nil {
		t.Errorf("RegisterNamespace(2003, reg-id-b): %v", err)
	}
}

func TestRegisterNamespaceNameConflict(t *testing.T) {
	orig := keys.MustRegisterNamespace(2004, "reg-name")
	ns, err := keys.RegisterNamespace(2005, "reg-name")
	if !errors.Is(err, keys.ErrNamespaceConflict) || ns != (keys.Namespace{}) {
		t.Fatalf("second id for name reg-name = %v, %v; want ErrNamespaceConflict", ns, err)
	}
	if _, ok := keys.LookupNamespace(2005); ok {
		t.Error("conflicting id 2005 was registered")
	}
	if got, _ := keys.LookupNamespace(2004); got != orig {
		t.Errorf("conflict changed the registration: %v", got)
	}
}

func TestRegisterNamespaceInvalidName(t *testing.T) {
	bad := []string{
		"", " ", "a b", "a/b", "ns(1)", "a,b", "a:b", "é", "\n", "a\x00", "\xff",
		"billing\n", strings.Repeat("n", 65),
	}
	for i, name := range bad {
		id := int32(2100 + i)
		ns, err := keys.RegisterNamespace(id, name)
		if !errors.Is(err, keys.ErrInvalid) || ns != (keys.Namespace{}) {
			t.Errorf("RegisterNamespace(%d, %+q) = %v, %v; want ErrInvalid", id, name, ns, err)
		}
		if _, ok := keys.LookupNamespace(id); ok {
			t.Errorf("invalid name %+q was registered", name)
		}
	}
	for i, name := range []string{"a", "Z", "0", "reg-valid-1", "reg.valid_2", "a_b", strings.Repeat("n", 64)} {
		id := int32(2200 + i)
		if _, err := keys.RegisterNamespace(id, name); err != nil {
			t.Errorf("RegisterNamespace(%d, %q): %v", id, name, err)
		}
	}
}

func TestMustRegisterNamespacePanics(t *testing.T) {
	keys.MustRegisterNamespace(2006, "reg-must")
	for _, c := range []struct {
		id   int32
		name string
		want error
	}{
		{2006, "reg-must-other", keys.ErrNamespaceConflict},
		{2007, "", keys.ErrInvalid},
	} {
		func() {
			defer func() {
				err, _ := recover().(error)
				if !errors.Is(err, c.want) {
					t.Errorf("MustRegisterNamespace(%d, %q) panicked with %v, want %v", c.id, c.name, err, c.want)
				}
			}()
			keys.MustRegisterNamespace(c.id, c.name)
		}()
	}
}

// Concurrent registration: every caller of the same (id, name) gets the same
// Namespace, exactly one of two competing names for an id wins, and the race
// detector sees no data race (including with String's lookups).
func TestRegisterNamespaceConcurrent(t *testing.T) {
	const n = 32
	var wg sync.WaitGroup
	results := make([]keys.Namespace, n)
	errs := make([]error, n)
	wins := make([]error, 2)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = keys.RegisterNamespace(2010, "reg-concurrent")
			_ = keys.Pair(2010, int32(i)).String()
		})
	}
	for i := range 2 {
		wg.Go(func() { _, wins[i] = keys.RegisterNamespace(2011, fmt.Sprintf("reg-race-%d", i)) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i] != results[0] || results[i].Name() != "reg-concurrent" {
			t.Errorf("caller %d: %v, %v", i, results[i], errs[i])
		}
	}
	if (wins[0] == nil) == (wins[1] == nil) {
		t.Errorf("competing names for id 2011: errors %v and %v; want exactly one conflict", wins[0], wins[1])
	}
}

func TestNamespaceKey(t *testing.T) {
	ns := keys.MustRegisterNamespace(2008, "reg-key")
	for _, id := range []int32{0, 1, -1, -42, 1 << 30} {
		k := ns.Key(id)
		if k != keys.Pair(2008, id) {
			t.Errorf("%v.Key(%d) = %v, want Pair(2008, %d)", ns, id, k, id)
		}
		c, o, s := k.PgLocks()
		back, err := keys.FromPgLocks(c, o, s)
		if err != nil || back != k {
			t.Errorf("FromPgLocks(%v.PgLocks()) = %v, %v", k, back, err)
		}
		if want := fmt.Sprintf("ns:reg-key(2008)/%d", id); k.String() != want {
			t.Errorf("String = %q, want %q", k.String(), want)
		}
	}
	if ns.Key(1) == ns.Key(2) {
		t.Error("distinct ids gave the same key")
	}
}

func TestZeroNamespace(t *testing.T) {
	var ns keys.Namespace
	if ns.ID() != 0 || ns.Name() != "" || ns.String() != "ns:<zero>" {
		t.Errorf("zero Namespace: ID=%d Name=%q String=%q", ns.ID(), ns.Name(), ns.String())
	}
	if k := ns.Key(1); !k.IsZero() {
		t.Errorf("zero Namespace Key(1) = %v, want the zero Key", k)
	}
}
