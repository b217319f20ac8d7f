// Package history records what lock and lease clients did, and when, and checks the
// record for linearizability with porcupine (github.com/anishathalye/porcupine). Only
// tests and test helpers import it; the library packages never do.
//
// # Recording
//
// A [Recorder] notes each operation's call time before it starts ([Recorder.Begin]) and
// its return time and outcome after it ends ([Pending.End]). Times come from [Now]: on
// Linux the machine-wide CLOCK_MONOTONIC, so histories recorded by several processes on
// one machine merge exactly. A recorder given a writer streams every operation as JSON
// lines twice, when it is called and when it returns, so a process killed mid-operation
// still leaves its call behind; [ReadFile] merges such a file, keeping the last line of
// each operation.
//
// # Unknown outcomes
//
// An operation that never returned (its process was SIGKILLed) or whose effect the
// client cannot know (cancelled mid-wait, connection cut) has [Unknown] as its outcome
// and returns, for the checker, at the end of the history: it may have taken effect at
// any moment after its call. An acquisition with an unknown outcome is the exception:
// see [LockModel] for why it counts as never granted and what that costs. Holders of a
// process that was killed lose their keys at an unknown moment: see [Crashed].
//
// # Models
//
// [LockModel] is an exclusive/shared lock per key: [Acquire] ([OK], [Busy], [Timeout]),
// [Release], [Lost]. [LeaseModel] is a lease with fencing tokens per resource: tokens
// are issued in increasing order, and a [Write] through lease.Fence is accepted only if
// its token is at least every token accepted before it. Both partition the history by
// key, so a long history costs what its busiest key costs.
//
// # Checking
//
// [Check] runs porcupine with a bound on time and fails the test unless the history is
// linearizable; on failure it writes porcupine's HTML visualisation (see [SaveHTML])
// and names the file.
package history
