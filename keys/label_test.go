package keys_test

import (
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

func TestNamespaceLabel(t *testing.T) {
	ns := keys.MustRegisterNamespace(31337, "label-test")
	for _, c := range []struct {
		ks   []keys.Key
		want string
	}{
		{nil, "none"},
		{[]keys.Key{keys.Int64(5)}, "none"},
		{[]keys.Key{keys.Pair(31338, 1)}, "none"},
		{[]keys.Key{ns.Key(1), ns.Key(2)}, "label-test"},
		{[]keys.Key{ns.Key(1), keys.Int64(5)}, "mixed"},
	} {
		if got := keys.NamespaceLabel(c.ks); got != c.want {
			t.Errorf("NamespaceLabel(%v) = %q, want %q", c.ks, got, c.want)
		}
	}
}
