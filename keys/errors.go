package keys

import "errors"

// Sentinel errors. Every error this package returns wraps exactly one of them
// with detail (fmt.Errorf("%w: ...")), so callers test with errors.Is.
var (
	// ErrInvalid reports input that cannot name a key or a namespace: an empty
	// string where one is required, a malformed namespace name, the zero
	// Namespace, or a pg_locks row that is not an advisory lock key.
	ErrInvalid = errors.New("keys: invalid input")

	// ErrNamespaceConflict reports a RegisterNamespace call that disagrees with
	// an earlier registration in this process: the id is taken by another name,
	// or the name is taken by another id.
	ErrNamespaceConflict = errors.New("keys: namespace conflict")
)
