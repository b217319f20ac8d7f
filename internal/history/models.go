package history

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// input is a porcupine operation's input; the output is its Outcome.
type input struct {
	client int // index into the history's client names
	name   string
	kind   Kind
	shared bool
	token  int64
	// relaxed: a Busy or Timeout that an acquisition with an unknown outcome may
	// explain; always legal.
	relaxed bool
}

func (in input) String() string {
	s := in.name + " " + string(in.kind)
	if in.kind == Acquire && in.shared {
		s += "(shared)"
	}
	if in.token != 0 {
		s += fmt.Sprintf(" #%d", in.token)
	}
	if in.relaxed {
		s += " (relaxed)"
	}
	return s
}

func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range ops {
		k := op.Metadata.(string)
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, k := range order {
		out = append(out, byKey[k])
	}
	return out
}

// lockState is who holds one key: holders lists client indexes, sorted, in a comparable
// form; excl says the single holder holds it exclusively.
type lockState struct {
	excl    bool
	holders string // "3,7,12"
}

func (s lockState) ids() []int {
	if s.holders == "" {
		return nil
	}
	var ids []int
	for f := range strings.SplitSeq(s.holders, ",") {
		n, _ := strconv.Atoi(f)
		ids = append(ids, n)
	}
	return ids
}

func makeLockState(excl bool, ids []int) lockState {
	slices.Sort(ids)
	fs := make([]string, len(ids))
	for i, id := range ids {
		fs[i] = strconv.Itoa(id)
	}
	return lockState{excl: excl && len(ids) > 0, holders: strings.Join(fs, ",")}
}

// LockModel is an exclusive/shared lock per key (operations partitioned by Key):
//
//   - Acquire OK: the key was free (shared: no exclusive holder) and the client did
//     not hold it; the client now holds it.
//   - Acquire Busy or Timeout: another client held the key in some mode. (A shared
//     request may find only shared holders: PostgreSQL queues it behind a waiting
//     exclusive request.)
//   - Acquire Unknown (cancelled, cut, killed): nothing changes. Such a call may have
//     held the key for a while, given back by the library or by the server when the
//     session ended; treating it as a holder would make the check exponential in the
//     number of such calls. It cannot excuse another acquisition (so an overlap is still
//     caught) but it can explain another client's Busy or Timeout: those on a key on
//     which an unknown acquisition was called before they returned are relaxed to
//     always legal.
//   - Release OK: the client held the key and no longer does. Any other outcome: it
//     no longer holds it, whether it did or not.
//   - Lost: the client no longer holds the key, whether it did or not.
func LockModel() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() any { return lockState{} },
		Step: func(st, in, out any) (bool, any) {
			s, op, res := st.(lockState), in.(input), out.(Outcome)
			ids := s.ids()
			holds := slices.Contains(ids, op.client)
			free := len(ids) == 0 || (op.shared && !s.excl)
			without := func() lockState {
				return makeLockState(s.excl, slices.DeleteFunc(ids, func(id int) bool { return id == op.client }))
			}
			switch op.kind {
			case Acquire:
				switch res {
				case OK:
					if holds || !free {
						return false, s
					}
					return true, makeLockState(!op.shared, append(ids, op.client))
				case Busy, Timeout:
					return op.relaxed || (len(ids) > 0 && !(holds && len(ids) == 1)), s
				case Unknown:
					return true, s
				}
				return false, s
			case Release:
				if res == OK && !holds {
					return false, s
				}
				return true, without()
			case Lost:
				return true, without()
			}
			return false, s
		},
		DescribeOperation: func(in, out any) string { return fmt.Sprintf("%v -> %v", in, out) },
		DescribeState: func(st any) string {
			s := st.(lockState)
			switch {
			case s.holders == "":
				return "free"
			case s.excl:
				return "exclusive: " + s.holders
			}
			return "shared: " + s.holders
		},
	}
}

// leaseState is one resource's fencing state.
type leaseState struct {
	issued   int64 // the highest token issued
	accepted int64 // the highest token a write was accepted with
}

// LeaseModel is a lease with fencing tokens per resource (operations partitioned by
// Key). It checks tokens and fenced writes, not exclusion in time: a lease promises
// that only while its holder is on time, and the fence is what makes a late holder
// harmless.
//
//   - Acquire OK with a token: the token is greater than every token issued before.
//     Acquire with another outcome, Release and Lost change nothing.
//   - Write OK: its token has been issued and is at least every token accepted before
//     (lease.Fence lets equal tokens pass: one holder writes several times); it is now
//     the highest accepted.
//   - Write Rejected: a greater token had been accepted.
//   - Write Unknown: accepted if it could be, else nothing changes.
func LeaseModel() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() any { return leaseState{} },
		Step: func(st, in, out any) (bool, any) {
			s, op, res := st.(leaseState), in.(input), out.(Outcome)
			switch op.kind {
			case Acquire:
				if res != OK || op.token == 0 {
					return true, s
				}
				if op.token <= s.issued {
					return false, s
				}
				s.issued = op.token
				return true, s
			case Write:
				ok := op.token >= s.accepted && op.token <= s.issued
				switch res {
				case OK:
					if !ok {
						return false, s
					}
					s.accepted = op.token
					return true, s
				case Rejected:
					return op.token < s.accepted, s
				case Unknown:
					if ok {
						s.accepted = op.token
					}
					return true, s
				}
				return false, s
			case Release, Lost:
				return true, s
			}
			return false, s
		},
		DescribeOperation: func(in, out any) string { return fmt.Sprintf("%v -> %v", in, out) },
		DescribeState: func(st any) string {
			s := st.(leaseState)
			return fmt.Sprintf("issued #%d, accepted #%d", s.issued, s.accepted)
		},
	}
}
