package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MaxResourcesPerCall caps the resources of one AcquireAll or TryAcquireAll.
const MaxResourcesPerCall = 100

// AcquireAll acquires a lease on every resource, all or nothing, with the
// same options. It sorts the names (byte order) and drops duplicates, then
// acquires one at a time in that order, waiting as Acquire does: every
// caller takes any two resources in the same order, so two calls asking for
// the same set in different orders cannot each hold what the other waits
// for. On any failure it releases what it had acquired (in reverse order,
// under a fresh context bounded by ReleaseTimeout) and returns the error.
// The leases are returned in sorted order; release each of them (or use
// ReleaseAll on their owner label).
//
// ctx governs the whole call. It returns ErrInvalid for no resources, more
// than MaxResourcesPerCall, or a bad resource or option.
func (m *Manager) AcquireAll(ctx context.Context, resources []string, opts *AcquireOptions) ([]*Lease, error) {
	return m.acquireAll(ctx, "acquire all", resources, opts, m.Acquire)
}

// TryAcquireAll is AcquireAll with a single attempt per resource: if any
// resource is held, it releases those it took and returns ErrNotAcquired.
func (m *Manager) TryAcquireAll(ctx context.Context, resources []string, opts *AcquireOptions) ([]*Lease, error) {
	return m.acquireAll(ctx, "try acquire all", resources, opts, m.TryAcquire)
}

func (m *Manager) acquireAll(ctx context.Context, op string, resources []string, opts *AcquireOptions, acquire acquireFunc) ([]*Lease, error) {
	names := slices.Clone(resources)
	slices.Sort(names)
	names = slices.Compact(names)
	switch {
	case len(names) == 0:
		return nil, opError(op, "", fmt.Errorf("%w: no resources", ErrInvalid))
	case len(names) > MaxResourcesPerCall:
		return nil, opError(op, "", fmt.Errorf("%w: %d resources, more than %d", ErrInvalid, len(names), MaxResourcesPerCall))
	}
	for _, r := range names { // all input checked before anything is acquired
		if _, err := m.newRequest(op, r, opts); err != nil {
			return nil, err
		}
	}
	held := make([]*Lease, 0, len(names))
	for _, r := range names {
		l, err := acquire(ctx, r, opts)
		if err != nil {
			return nil, errors.Join(err, m.releaseLeases(ctx, held))
		}
		held = append(held, l)
	}
	return held, nil
}

// releaseLeases releases ls in reverse order under one fresh bounded
// context, reporting failures other than an already lost lease.
func (m *Manager) releaseLeases(ctx context.Context, ls []*Lease) error {
	if len(ls) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.releaseTimeout)
	defer cancel()
	var failed []string
	var errs []error
	for _, l := range slices.Backward(ls) {
		if err := l.Release(rctx); err != nil && !errors.Is(err, ErrLeaseLost) {
			failed = append(failed, clip(l.resource))
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: could not give back %s: %w", ErrNotReleased, strings.Join(failed, ", "), errors.Join(errs...))
}
