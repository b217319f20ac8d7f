package advisory

import "github.com/pgxlock/pgxlock/keys"

// LocalWaiters reports how many calls of l wait in its local queue for k
// (not on the server, not on their way there); for tests only.
func LocalWaiters(l *Locker, k keys.Key) int { return l.gates.localWaiters(k) }
