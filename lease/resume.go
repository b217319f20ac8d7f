package lease

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Ref is what identifies an acquisition across processes: enough to renew or
// release it later, from another request or another instance, without the
// *Lease value (the pessimistic offline lock of a web application takes the
// lease in one request and releases it in a later one). Its fields are
// exported so it can be stored (JSON, a session, a hidden form field).
// Possession of a Ref is what allows a renewal or release: treat it as a
// secret of the holder, like a session cookie.
//
// A Ref kept by a client is client input, so nothing in it can widen the
// lease: Resume takes the TTL from the Manager, not from the Ref, and a Ref
// whose Mode, Token or ID was edited matches no row (Renew and Release then
// report ErrLeaseLost).
type Ref struct {
	Resource string `json:"resource"`
	ID       string `json:"id"`    // the acquisition's random id
	Token    int64  `json:"token"` // the fencing token
	Mode     Mode   `json:"mode"`
	// TTL is the acquisition's TTL, for information only: Resume ignores it.
	TTL time.Duration `json:"ttl"`
}

// Ref returns the reference of this acquisition. After a successful
// TryUpgrade its ID differs from the one before: the upgrade gives the row a
// new lease id, so that only a Ref taken after the upgrade (Mode Exclusive)
// matches the upgraded row.
func (l *Lease) Ref() Ref {
	l.mu.Lock()
	upgraded := l.upgraded
	l.mu.Unlock()
	if upgraded {
		return Ref{Resource: l.resource, ID: l.id + upgradedSuffix, Token: l.token, Mode: Exclusive, TTL: l.ttl}
	}
	return Ref{Resource: l.resource, ID: l.id, Token: l.token, Mode: l.mode, TTL: l.ttl}
}

// Resume rebuilds a Lease from a Ref, for Renew and Release. It sends
// nothing: a Ref of a lease that has since expired, been released or taken
// over is only found out by the first Renew or Release (ErrLeaseLost).
// The resumed lease renews for the Manager's TTL (ManagerConfig.TTL), never
// for the Ref's: a lease acquired with a longer per-call TTL is renewed for
// the shorter one once resumed (use a Manager configured with that TTL to
// keep it). Owner, AcquiredAt and ExpiresAt of a resumed lease are unknown
// (empty) until a successful Renew sets ExpiresAt. It returns ErrInvalid for
// a Ref with no resource or id, an invalid resource, or an unknown mode.
func (m *Manager) Resume(ref Ref) (*Lease, error) {
	const op = "resume"
	if ref.Resource == "" || ref.ID == "" {
		return nil, opError(op, ref.Resource, fmt.Errorf("%w: incomplete Ref", ErrInvalid))
	}
	if err := checkText("resource", ref.Resource, MaxResourceLen); err != nil {
		return nil, opError(op, ref.Resource, err)
	}
	if err := checkText("lease id", ref.ID, MaxResourceLen); err != nil {
		return nil, opError(op, ref.Resource, err)
	}
	if ref.Mode != Exclusive && ref.Mode != Shared {
		return nil, opError(op, ref.Resource, fmt.Errorf("%w: unknown mode %v", ErrInvalid, ref.Mode))
	}
	return &Lease{m: m, id: ref.ID, resource: ref.Resource, mode: ref.Mode, token: ref.Token, ttl: m.ttl}, nil
}

// ColumnRef identifies a column-lease acquisition across processes, as Ref
// does for the lock-manager table. It survives encoding/json when the row id
// is an integer (up to int64, decoded as int64, never as float64) or a string
// (a uuid in its text form is a string); other id types are refused by
// UnmarshalJSON.
type ColumnRef struct {
	ID    any    `json:"id"`    // the row id
	Owner string `json:"owner"` // the acquisition's random owner token
	Token int64  `json:"token"` // the fencing token
}

// UnmarshalJSON decodes a ColumnRef, reading a numeric id as an int64 and a
// string id as a string. Its errors are *Error values (Op "decode column
// ref") wrapping ErrInvalid: an id that is not an integer in int64's range
// or a string, or a field of the wrong JSON type (the *json.UnmarshalTypeError
// stays in the chain).
func (r *ColumnRef) UnmarshalJSON(data []byte) error {
	if err := r.unmarshalJSON(data); err != nil {
		return opError("decode column ref", "", err)
	}
	return nil
}

func (r *ColumnRef) unmarshalJSON(data []byte) error {
	var raw struct {
		ID    json.RawMessage `json:"id"`
		Owner string          `json:"owner"`
		Token int64           `json:"token"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var id any
	if len(raw.ID) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw.ID))
		dec.UseNumber()
		if err := dec.Decode(&id); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	switch v := id.(type) {
	case nil, string:
	case json.Number:
		n, err := strconv.ParseInt(v.String(), 10, 64)
		if err != nil {
			return fmt.Errorf("%w: ColumnRef id %s is not an int64", ErrInvalid, clip(v.String()))
		}
		id = n
	default:
		return fmt.Errorf("%w: ColumnRef id must be a JSON integer or string, got %T", ErrInvalid, v)
	}
	*r = ColumnRef{ID: id, Owner: raw.Owner, Token: raw.Token}
	return nil
}

// Ref returns the reference of this acquisition.
func (l *ColumnLease) Ref() ColumnRef { return ColumnRef{ID: l.id, Owner: l.owner, Token: l.token} }

// Resume rebuilds a ColumnLease from a ColumnRef, for Renew and Release. It
// sends nothing; see Manager.Resume. Renew and Release of the resumed lease
// match the row's owner and fence columns against the Ref's Owner and
// Token, so a Ref with its owner or token edited matches nothing
// (ErrLeaseLost). The id is compared as the id column's type reads it: an id
// edited to another spelling of the same value ("05" for 5 on a bigint
// column) names the same row; one naming another row matches nothing
// (ErrLeaseLost, or ErrNotFound for an id no row has). It returns ErrInvalid, before any SQL,
// for an id TryAcquire would refuse, a token below 1 (what a zero ColumnRef
// holds; a fence column that starts at 0, as Migrate creates it, never
// issues one), and an owner that is not an owner token this package issues (a
// lowercase RFC 4122 UUID, as Owner returns; NUL bytes, invalid UTF-8 and
// other text included); such an error does not quote the owner. Because
// Resume cannot check the Ref, use the resumed lease's Token for a fenced
// write ([Fence.Update]) only after a successful Renew: a forged token is
// refused there, before it can reach a fence.
func (c *Column) Resume(ref ColumnRef) (*ColumnLease, error) {
	if err := checkID(ref.ID); err != nil {
		return nil, opError("resume", resourceOf(ref.ID), err)
	}
	switch {
	case ref.Owner == "":
		return nil, opError("resume", resourceOf(ref.ID), fmt.Errorf("%w: incomplete ColumnRef", ErrInvalid))
	case !isOwnerToken(ref.Owner):
		return nil, opError("resume", resourceOf(ref.ID), fmt.Errorf(
			"%w: ColumnRef owner (%d bytes) is not an owner token (a lowercase UUID)", ErrInvalid, len(ref.Owner)))
	case ref.Token < 1:
		return nil, opError("resume", resourceOf(ref.ID), fmt.Errorf("%w: ColumnRef token %d is below 1", ErrInvalid, ref.Token))
	}
	return &ColumnLease{c: c, id: ref.ID, owner: ref.Owner, token: ref.Token}, nil
}
