package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// MaxResourcesPerCall caps the resources of one AcquireAll or TryAcquireAll.
const MaxResourcesPerCall = 100

// AcquireAll acquires a lease on every resource, all or nothing, with the
// same options. It sorts the names (byte order) and drops duplicates, then
// acquires one at a time in that order, waiting as Acquire does: every
// caller takes any two resources in the same order, so two calls asking for
// the same set in different orders cannot each hold what the other waits
// for. On any failure it gives back everything the call took or may have
// taken (the leases it acquired, and the clean-up of the acquisition that
// failed: see Acquire), all at the same time, under one fresh context
// bounded by ReleaseTimeout, which the ROLLBACK of the failed attempt's
// transaction shares, and returns the error: the call returns within ctx's
// deadline plus one ReleaseTimeout. A lease it could not give back within
// that bound (the server unreachable) stays held until its TTL, and the
// error then also wraps ErrNotReleased, naming the resources. The leases are returned in sorted
// order; release each of them (or use ReleaseAll on their owner label).
//
// ctx governs the whole call. It returns ErrInvalid for no resources, more
// than MaxResourcesPerCall, or a bad resource or option.
func (m *Manager) AcquireAll(ctx context.Context, resources []string, opts *AcquireOptions) ([]*Lease, error) {
	return m.acquireAll(ctx, "acquire all", resources, opts, m.acquire)
}

// TryAcquireAll is AcquireAll with a single attempt per resource: if any
// resource is held, it releases those it took and returns ErrNotAcquired.
// It returns within ctx's deadline plus one ReleaseTimeout, as AcquireAll.
func (m *Manager) TryAcquireAll(ctx context.Context, resources []string, opts *AcquireOptions) ([]*Lease, error) {
	return m.acquireAll(ctx, "try acquire all", resources, opts, m.tryAcquire)
}

// acquireOne is Manager.acquire or Manager.tryAcquire: an acquisition that
// leaves its clean-up to the caller.
type acquireOne func(context.Context, *request) (*Lease, func(context.Context), error)

func (m *Manager) acquireAll(ctx context.Context, op string, resources []string, opts *AcquireOptions, acquire acquireOne) ([]*Lease, error) {
	names := slices.Clone(resources)
	slices.Sort(names)
	names = slices.Compact(names)
	switch {
	case len(names) == 0:
		return nil, opError(op, "", fmt.Errorf("%w: no resources", ErrInvalid))
	case len(names) > MaxResourcesPerCall:
		return nil, opError(op, "", fmt.Errorf("%w: %d resources, more than %d", ErrInvalid, len(names), MaxResourcesPerCall))
	}
	reqs := make([]*request, len(names))
	for i, r := range names { // all input checked before anything is acquired
		req, err := m.newRequest(op, r, opts)
		if err != nil {
			return nil, err
		}
		reqs[i] = req
	}
	ctx = withCleanupClock(ctx)
	held := make([]*Lease, 0, len(names))
	for _, req := range reqs {
		l, cleanup, err := acquire(ctx, req)
		if err != nil {
			return nil, joinRelease(op, err, m.releaseLeases(ctx, held, cleanup))
		}
		held = append(held, l)
	}
	return held, nil
}

// joinRelease is the error of a failed (Try)AcquireAll: the failed
// acquisition's *Error (its op and resource) with the give-back's failure,
// if any, joined into its cause, so that the result is one *Error in which
// errors.Is and errors.As find both.
func joinRelease(op string, err, releaseErr error) error {
	if releaseErr == nil {
		if _, ok := err.(*Error); ok {
			return err
		}
		return opError(op, "", err)
	}
	if e, ok := err.(*Error); ok {
		return &Error{Op: e.Op, Resource: e.Resource, Err: errors.Join(e.Err, releaseErr), asIs: e.asIs}
	}
	return opError(op, "", errors.Join(err, releaseErr))
}

// releaseLeases releases ls, and runs cleanup (the clean-up of the failed
// acquisition, if any), all concurrently under one fresh context bounded by
// ReleaseTimeout, reporting failures other than an already lost lease.
// Each release is retried on another connection when the pooled one was
// dead, within that bound (as Do's release is).
func (m *Manager) releaseLeases(ctx context.Context, ls []*Lease, cleanup func(context.Context)) error {
	if len(ls) == 0 && cleanup == nil {
		return nil
	}
	rctx, cancel := cleanupContext(ctx, m.releaseTimeout)
	defer cancel()
	var wg sync.WaitGroup
	if cleanup != nil {
		wg.Go(func() { cleanup(rctx) })
	}
	errs := make([]error, len(ls))
	for i, l := range ls {
		wg.Go(func() { errs[i] = releaseRetrying(rctx, l.Release) })
	}
	wg.Wait()
	var failed []string
	var failures []error
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			failed = append(failed, clip(ls[i].resource))
			failures = append(failures, err)
		}
	}
	if len(failures) == 0 {
		return nil
	}
	return fmt.Errorf("%w: could not give back %s: %w", ErrNotReleased, strings.Join(failed, ", "), errors.Join(failures...))
}
