package keys_test

import (
	"errors"
	"fmt"

	"github.com/pgxlock/pgxlock/keys"
)

// A namespace is declared once, as a package-level variable.
var billing = keys.MustRegisterNamespace(7, "billing")

func ExampleHash() {
	k := keys.Hash("billing:invoice:42")
	v, _ := k.Int64()
	fmt.Println(v)
	fmt.Println(k)             // logs show the number, never "billing:invoice:42"
	fmt.Println(keys.Hash("")) // the empty string is a valid input
	// Output:
	// 3965314469645659287
	// int64:3965314469645659287
	// int64:-2039914840885289964
}

func ExamplePair() {
	k := keys.Pair(-1, 42)
	a, b, ok := k.Pair()
	fmt.Println(a, b, ok, k.Space())
	// The same 64 bits in the bigint space are another lock.
	fmt.Println(k == keys.Int64(-1<<32|42))
	// Output:
	// -1 42 true pair
	// false
}

func ExampleNamespace_Key() {
	k := billing.Key(42) // exact: pg_advisory_lock(7, 42)
	fmt.Println(k)
	a, b, _ := k.Pair()
	fmt.Println(a, b)
	// Output:
	// ns:billing(7)/42
	// 7 42
}

func ExampleNamespace_Hash() {
	k, err := billing.Hash("invoice-42")
	fmt.Println(k, err)
	_, err = billing.Hash("")
	fmt.Println(errors.Is(err, keys.ErrInvalid))
	// Output:
	// int64:2892907514795443333 <nil>
	// true
}

func ExampleRegisterNamespace() {
	jobs, err := keys.RegisterNamespace(42, "tenant-jobs")
	fmt.Println(jobs, err)
	_, err = keys.RegisterNamespace(42, "reports")
	fmt.Println(errors.Is(err, keys.ErrNamespaceConflict))
	fmt.Println(err)
	// Output:
	// ns:tenant-jobs(42) <nil>
	// true
	// keys: namespace conflict: id 42 is already registered as "tenant-jobs", not "reports"
}

func ExampleNormalize() {
	ks := keys.Normalize([]keys.Key{
		billing.Key(2), keys.Int64(10), billing.Key(1), keys.Int64(-3), billing.Key(2),
	})
	fmt.Println(ks)
	// Output: [int64:-3 int64:10 ns:billing(7)/1 ns:billing(7)/2]
}

func ExampleFromPgLocks() {
	// Rows of: SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory'
	k, err := keys.FromPgLocks(4294967295, 4294967254, 1)
	fmt.Println(k, err)
	k, err = keys.FromPgLocks(7, 4294967254, 2)
	fmt.Println(k, err)
	// Output:
	// int64:-42 <nil>
	// ns:billing(7)/-42 <nil>
}

func ExampleKey_PgLocks() {
	classid, objid, objsubid := keys.Int64(-42).PgLocks()
	fmt.Println(classid, objid, objsubid)
	classid, objid, objsubid = billing.Key(-42).PgLocks()
	fmt.Println(classid, objid, objsubid)
	// Output:
	// 4294967295 4294967254 1
	// 7 4294967254 2
}
