package advisory_test

import (
	"github.com/pgxlock/pgxlock/internal/history"
	"github.com/pgxlock/pgxlock/keys"
)

// beginAttempt records the call of an acquisition of ks by client (see history.Attempt);
// keys are named by their String form.
func beginAttempt(rec *history.Recorder, client string, ks []keys.Key, shared bool) *history.Attempt {
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.String()
	}
	return rec.Attempt(client, names, shared)
}
