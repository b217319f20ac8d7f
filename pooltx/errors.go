package pooltx

import "fmt"

// CleanupError reports a cleanup step that failed after the work: the
// connection it ran on has been destroyed. Step names the operation
// ("rollback", "commit", "unlock", "reset", ...); Err is the cause and may
// be a *pgconn.PgError or a context error.
type CleanupError struct {
	Step string
	Err  error
}

// Error renders "pooltx: <step>: <cause>".
func (e *CleanupError) Error() string {
	return fmt.Sprintf("pooltx: %s: %v", e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *CleanupError) Unwrap() error { return e.Err }
