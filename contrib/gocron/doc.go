// Package pgxlockgocron runs gocron (github.com/go-co-op/gocron/v2) jobs
// across several schedulers on PostgreSQL advisory locks: no Redis, no
// etcd, no new server.
//
//	locker, _ := advisory.New(pool, advisory.Config{})
//	jobs, _ := pgxlockgocron.NewLocker(locker, pgxlockgocron.Config{})
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(jobs))
//
// or, for one scheduler at a time running every job:
//
//	leader, _ := pgxlockgocron.NewElector(locker, "billing-scheduler", pgxlockgocron.Config{})
//	defer leader.Close(ctx)
//	s, _ := gocron.NewScheduler(gocron.WithDistributedElector(leader))
//
// # Locker: one run at a time per job
//
// [Locker.Lock] tries the job's lock without waiting. A busy key fails with
// advisory.ErrNotAcquired, which gocron treats as "skip this run" (a key
// its own process holds is learnt busy on a second connection: with none
// free in the pool, the attempt waits up to the Locker's LockTimeout, else
// advisory.DefaultTryConnWait, and fails with advisory.ErrNoConnection; the
// run is skipped all the same). The lock
// is an advisory.Lock handle, a session lock held on a pinned connection
// through the run and released by gocron's Unlock after it.
//
// The lock excludes overlapping runs, not repeated ones: a scheduler whose
// tick fires after another scheduler's run has finished takes the free lock
// and runs the job again (gocron's own Locker documentation warns of this
// splay between schedulers). Align the schedulers' start times
// (gocron.WithStartAt) and keep the job longer than the splay, or use the
// Elector, whose leader alone runs every tick.
//
// It excludes them while its session lives: when the holder's connection
// dies mid-run (its backend terminated, a failover), PostgreSQL frees the
// key at once and another scheduler may start the job while the first run
// goes on. gocron cannot tell that run (it ignores the error of Unlock,
// which then matches advisory.ErrLockLost). A job whose runs must never
// overlap, even then, fences its writes (package lease's tokens) or holds
// a lease.Manager.Do lease, whose context is cancelled on a loss.
//
// # Elector: one leader
//
// [Elector.IsLeader] returns nil while this scheduler holds the election's
// session lock, taking it without waiting when it is free: the first
// scheduler to ask becomes leader and stays leader until it closes the
// Elector or loses its connection. The others get advisory.ErrNotAcquired
// and gocron skips their runs.
//
// When the leader's connection dies, PostgreSQL releases the lock at once
// and the next scheduler to ask takes it: a SIGKILLed or crashed leader is
// replaced at the others' next tick. The old leader learns of the loss
// through the advisory.Lock watcher: at once for a terminated backend or a
// closed socket, within the advisory.Config's HeartbeatInterval +
// HeartbeatTimeout (5 s + 2 s by default) for a frozen server or a silent
// network partition. Until then it still believes it leads, so for that
// long two schedulers may run the same tick. The first IsLeader after the
// loss returns an error matching advisory.ErrLockLost (that run is skipped);
// the next one contends again.
//
// # Keys
//
// A job's key is keys.Hash(job name) (gocron's key: the job's name, by
// default the function's name), or Config.Namespace.Hash(job name) under a
// namespace. An election's key is derived from its name the same way. To
// find a holder: "pgxlock locks --key hash:NAME", or with a namespace
// "pgxlock locks --ns NS=ID --key ns:NS/hash:NAME". Keys are logged and
// listed as numbers, never as the name they were hashed from.
package pgxlockgocron
