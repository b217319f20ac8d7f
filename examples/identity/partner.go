package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// The user's two identities at the identity provider.
const (
	identityA = "google|u1"
	identityB = "github|u1"
)

// partner is a fake identity provider, served in-process by httptest. Like many real APIs
// it accepts any well-formed call: keeping its state consistent is the caller's job.
//
// Its state is which identity each identity is linked under: "" for a primary. The
// consistent states are A primary with B under it, and the reverse.
type partner struct {
	mu     sync.Mutex
	parent map[string]string
	onCall func(r *http.Request) // instrumentation, runs first in every call
}

func newPartner() *partner {
	p := &partner{}
	p.reset()
	return p
}

// reset puts the provider back in its first state: A primary, B linked under it.
func (p *partner) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parent = map[string]string{identityA: "", identityB: identityA}
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.onCall != nil {
		p.onCall(r)
	}
	time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond) // a remote call takes a while
	primary, secondary := r.FormValue("primary"), r.FormValue("secondary")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.URL.Path {
	case "/unlink": // secondary stops being linked under primary
		p.parent[secondary] = ""
	case "/link": // secondary becomes linked under primary
		p.parent[secondary] = primary
	default:
		http.NotFound(w, r)
	}
}

// primary returns the provider's primary identity, or an error describing the corruption
// when its state is not one a single switch can produce.
func (p *partner) primary() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, b := p.parent[identityA], p.parent[identityB]
	switch {
	case a == "" && b == identityA:
		return identityA, nil
	case b == "" && a == identityB:
		return identityB, nil
	}
	return "", fmt.Errorf("%s linked under %q, %s linked under %q", identityA, a, identityB, b)
}

// partnerClient calls the provider. It has no database access at all.
type partnerClient struct {
	base string
	http *http.Client
}

// call posts one operation, tagged with the request id found in ctx.
func (c partnerClient) call(ctx context.Context, op, primary, secondary string) error {
	q := url.Values{"primary": {primary}, "secondary": {secondary}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/"+op+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Request-Id", requestID(ctx))
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("partner %s: %s", op, resp.Status)
	}
	return nil
}

func other(identity string) string {
	if identity == identityA {
		return identityB
	}
	return identityA
}
