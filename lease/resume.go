package lease

import (
	"fmt"
	"time"
)

// Ref is what identifies an acquisition across processes: enough to renew or
// release it later, from another request or another instance, without the
// *Lease value (the pessimistic offline lock of a web application takes the
// lease in one request and releases it in a later one). Its fields are
// exported so it can be stored (JSON, a session, a hidden form field).
// Possession of a Ref is what allows a renewal or release: treat it as a
// secret of the holder, like a session cookie.
type Ref struct {
	Resource string        `json:"resource"`
	ID       string        `json:"id"`    // the acquisition's random id
	Token    int64         `json:"token"` // the fencing token
	Mode     Mode          `json:"mode"`
	TTL      time.Duration `json:"ttl"`
}

// Ref returns the reference of this acquisition.
func (l *Lease) Ref() Ref {
	return Ref{Resource: l.resource, ID: l.id, Token: l.token, Mode: l.mode, TTL: l.ttl}
}

// Resume rebuilds a Lease from a Ref, for Renew and Release. It sends
// nothing: a Ref of a lease that has since expired, been released or taken
// over is only found out by the first Renew or Release (ErrLeaseLost).
// Owner, AcquiredAt and ExpiresAt of a resumed lease are unknown (empty)
// until a successful Renew sets ExpiresAt. It returns ErrInvalid for a Ref
// with no resource, id or TTL.
func (m *Manager) Resume(ref Ref) (*Lease, error) {
	if ref.Resource == "" || ref.ID == "" || ref.TTL <= 0 {
		return nil, opError("resume", ref.Resource, fmt.Errorf("%w: incomplete Ref", ErrInvalid))
	}
	return &Lease{m: m, id: ref.ID, resource: ref.Resource, mode: ref.Mode, token: ref.Token, ttl: ref.TTL}, nil
}

// ColumnRef identifies a column-lease acquisition across processes, as Ref
// does for the lock-manager table.
type ColumnRef struct {
	ID    any    `json:"id"`    // the row id
	Owner string `json:"owner"` // the acquisition's random owner token
	Token int64  `json:"token"` // the fencing token
}

// Ref returns the reference of this acquisition.
func (l *ColumnLease) Ref() ColumnRef { return ColumnRef{ID: l.id, Owner: l.owner, Token: l.token} }

// Resume rebuilds a ColumnLease from a ColumnRef, for Renew and Release. It
// sends nothing; see Manager.Resume.
func (c *Column) Resume(ref ColumnRef) (*ColumnLease, error) {
	if ref.ID == nil || ref.Owner == "" {
		return nil, opError("resume", fmt.Sprint(ref.ID), fmt.Errorf("%w: incomplete ColumnRef", ErrInvalid))
	}
	return &ColumnLease{c: c, id: ref.ID, owner: ref.Owner, token: ref.Token}, nil
}
