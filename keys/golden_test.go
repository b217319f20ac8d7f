package keys_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/pgxlock/pgxlock/keys"
)

// Namespace ids registered by this package's tests. The registry is
// process-wide and only grows, so every test uses its own ids:
//
//	7, 1001, -1, 0, MaxInt32, MinInt32   golden namespaces (7 "billing" is shared with the examples)
//	42                                   examples
//	2000-2999                            namespace_test.go, one id (or a few) per test
//	3000-3999                            key_test.go, fuzz_test.go
var goldenNamespaces = map[int32]string{
	7:             "billing",
	1001:          "tenant",
	-1:            "golden.neg1",
	0:             "golden.zero",
	math.MaxInt32: "golden.max",
	math.MinInt32: "golden.min",
}

func goldenNamespace(t testing.TB, id int32) keys.Namespace {
	t.Helper()
	ns, err := keys.RegisterNamespace(id, goldenNamespaces[id])
	if err != nil {
		t.Fatalf("RegisterNamespace(%d): %v", id, err)
	}
	return ns
}

// hashGoldens freezes Hash / HashInt64. Do not edit a value: a change here is
// a change of every key derived from that string in every deployed service.
//
// The values were computed while writing this file with Go (crypto/sha256)
// and, independently, with Node v20 from the same strings passed as JSON:
//
//	node -e 'const {createHash}=require("crypto");
//	  for (const s of JSON.parse(fs.readFileSync(0,"utf8")))
//	    console.log(createHash("sha256").update(s).digest().readBigInt64BE(0).toString())'
//
// and the two outputs were identical. The "\xff" row (not UTF-8, so no JS
// string can carry it) was computed with update(Buffer.from([0xff])).
// TestHashMatchesPostgres (keys_pg_test.go) checks every row against
// PostgreSQL's own sha256 on each run.
var hashGoldens = []struct {
	s    string
	want int64
	// notText marks inputs PostgreSQL text cannot hold (NUL, invalid UTF-8);
	// the database test hashes those as bytea instead of through convert_to.
	notText bool
}{
	{s: "", want: -2039914840885289964}, // SHA-256 of no bytes: e3b0c442 98fc1c14 ...
	{s: " ", want: 3938934374763561727},
	{s: "   ", want: 769409269663454620},
	{s: "\x00", want: 7940984811893783192, notText: true},
	{s: "\xff", want: -6336552689897750320, notText: true}, // not valid UTF-8: bytes hashed as they are
	{s: "a", want: -3848465438864589366},
	{s: "A", want: 6168500820899059065},
	{s: "hello", want: 3238736544897475342},
	{s: "hello\n", want: 6382081936538853128}, // trailing newline is part of the key
	{s: "line\r\n", want: -8557250619248368391},
	{s: "\ttab", want: -851143756411401910},
	{s: "123", want: -6456573788065484899}, // not Int64(123)
	{s: "-1", want: 1994368463219536380},
	{s: "NULL", want: -346055891100056158},
	{s: "billing:invoice:42", want: 3965314469645659287},
	{s: "tenant/123/report", want: 4299001927372441635},
	{s: "migrations", want: -3058229681751119483},
	{s: strings.Repeat("pgxlock", 1000), want: -6993052896644477403}, // 7000 bytes
	{s: "🔒", want: 7701668758205862634},
	{s: "👩\u200d💻", want: 4788017256080549103}, // ZWJ sequence
	{s: "鎖", want: 8619597490228513994},
	{s: "日本語のロック", want: -222753044876531681},
	{s: "잠금", want: -7527180025593837471},
	{s: "\u00e9", want: 5375421630974772051},      // é precomposed (NFC)
	{s: "e\u0301", want: -4678546791977036110},    // é decomposed (NFD): a different key
	{s: "caf\u00e9", want: -8858723660289998967},  // NFC
	{s: "cafe\u0301", want: -9084035275619258937}, // NFD
	{s: "ação", want: 460501304809897659},
	{s: "coração", want: -1593859405567719354},
	{s: "Migração única", want: 2957561085054635157},
	{s: "relatório diário", want: -8999594929682575372},
	{s: "\u2126", want: 4688680335508117069},  // OHM SIGN
	{s: "\u03a9", want: -2033899810518268323}, // GREEK CAPITAL OMEGA: looks the same, another key
	{s: "\ufeffabc", want: 2029113795799960090},
	{s: "قفل", want: 8653008155497528194},
	{s: "\U0010ffff", want: 8109728238477728597},
	{s: "O'Brien", want: -1808717972395317276},
	{s: `say "hi"`, want: -694704871022723887},
	{s: "'; DROP TABLE locks; --", want: 5745730403304441439},
	{s: "a;b;c", want: 8164334078416743132},
	{s: `back\slash`, want: 1484183146934926802},
}

// nsHashGoldens freezes Namespace.Hash (derivation "pgxlock:v1"). Computed
// while writing this file with Go and, independently, with Node v20:
//
//	const b = Buffer.alloc(4); b.writeInt32BE(id);
//	createHash("sha256").update(Buffer.concat([Buffer.from("pgxlock:v1\0"), b,
//	  Buffer.from([0]), Buffer.from(s, "utf8")])).digest().readBigInt64BE(0)
//
// with identical results. TestNamespaceHashMatchesPostgres checks them against
// PostgreSQL on each run.
var nsHashGoldens = []struct {
	id      int32
	s       string
	want    int64
	notText bool
}{
	{id: 7, s: "invoice-42", want: 2892907514795443333},
	{id: 7, s: "🔒", want: -2536215787576051701},
	{id: 7, s: "\x00", want: 5491230974646020619, notText: true},
	{id: 1001, s: "tenant:123", want: -1701824205372132367},
	{id: -1, s: "x", want: 3221878055293164082},
	{id: 0, s: "a", want: 280280963370319660},
	{id: math.MaxInt32, s: "ação", want: -6696966806864113563},
	{id: math.MinInt32, s: "e\u0301", want: -6736358127414519515},
}

func TestHashGoldens(t *testing.T) {
	var neg, pos int
	for _, g := range hashGoldens {
		if got := keys.HashInt64(g.s); got != g.want {
			t.Errorf("HashInt64(%+q) = %d, want %d", g.s, got, g.want)
		}
		if got, want := keys.Hash(g.s), keys.Int64(g.want); got != want {
			t.Errorf("Hash(%+q) = %v, want %v", g.s, got, want)
		}
		if g.want < 0 {
			neg++
		} else {
			pos++
		}
	}
	if len(hashGoldens) < 20 || neg == 0 || pos == 0 {
		t.Errorf("golden set too thin: %d rows, %d negative, %d positive", len(hashGoldens), neg, pos)
	}
}

func TestNamespaceHashGoldens(t *testing.T) {
	for _, g := range nsHashGoldens {
		ns := goldenNamespace(t, g.id)
		got, err := ns.Hash(g.s)
		if err != nil {
			t.Errorf("%v.Hash(%+q): %v", ns, g.s, err)
			continue
		}
		if want := keys.Int64(g.want); got != want {
			t.Errorf("%v.Hash(%+q) = %v, want %v", ns, g.s, got, want)
		}
		if plain := keys.Hash(g.s); got == plain {
			t.Errorf("%v.Hash(%+q) equals the plain Hash: no domain separation", ns, g.s)
		}
	}
}

// Unicode normalization is the caller's business: visually equal strings in
// different forms are different keys, in Go exactly as in Node and PostgreSQL.
func TestHashDoesNotNormalize(t *testing.T) {
	pairs := [][2]string{
		{"\u00e9", "e\u0301"},
		{"caf\u00e9", "cafe\u0301"},
		{"\u2126", "\u03a9"},
		{"abc", "\ufeffabc"},
		{"hello", "hello\n"},
	}
	for _, p := range pairs {
		if keys.Hash(p[0]) == keys.Hash(p[1]) {
			t.Errorf("Hash(%+q) == Hash(%+q)", p[0], p[1])
		}
	}
}

func TestNamespaceHashInvalid(t *testing.T) {
	ns := goldenNamespace(t, 7)
	k, err := ns.Hash("")
	if !errors.Is(err, keys.ErrInvalid) || !k.IsZero() {
		t.Errorf(`%v.Hash("") = %v, %v; want zero Key, ErrInvalid`, ns, k, err)
	}
	k, err = keys.Namespace{}.Hash("x")
	if !errors.Is(err, keys.ErrInvalid) || !k.IsZero() {
		t.Errorf(`Namespace{}.Hash("x") = %v, %v; want zero Key, ErrInvalid`, k, err)
	}
}

func TestNamespaceHashSeparatesNamespaces(t *testing.T) {
	a, b := goldenNamespace(t, 0), goldenNamespace(t, -1)
	for _, s := range []string{"x", "a", "tenant:123"} {
		ka, _ := a.Hash(s)
		kb, _ := b.Hash(s)
		if ka == kb {
			t.Errorf("%v and %v hash %q to the same key %v", a, b, s, ka)
		}
	}
}
