package keys

import "testing"

// The namespaced input layout is part of the frozen derivation documented in
// doc.go and Namespace.Hash; this pins it byte for byte.
func TestNsHashInputLayout(t *testing.T) {
	cases := []struct {
		id   int32
		s    string
		want string
	}{
		{7, "x", "pgxlock:v1\x00\x00\x00\x00\x07\x00x"},
		{-1, "ab", "pgxlock:v1\x00\xff\xff\xff\xff\x00ab"},
		{-2147483648, "é", "pgxlock:v1\x00\x80\x00\x00\x00\x00\xc3\xa9"},
	}
	for _, c := range cases {
		if got := string(nsHashInput(c.id, c.s)); got != c.want {
			t.Errorf("nsHashInput(%d, %q) = %q, want %q", c.id, c.s, got, c.want)
		}
	}
}
