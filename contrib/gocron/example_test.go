package pgxlockgocron_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgxlock/pgxlock/advisory"
	pgxlockgocron "github.com/pgxlock/pgxlock/contrib/gocron"
	"github.com/pgxlock/pgxlock/internal/pgtest"
)

// Every replica runs the same scheduler; each run takes the job's lock
// without waiting, and a replica that finds it busy skips the run.
func ExampleNewLocker() {
	pool, done := pgtest.ExamplePool()
	defer done()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		panic(err)
	}
	jobs, err := pgxlockgocron.NewLocker(locker, pgxlockgocron.Config{})
	if err != nil {
		panic(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(jobs))
	if err != nil {
		panic(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() { close(ran) }), gocron.WithName("pgxlock-example-report-"+rand.Text()))
	if err != nil {
		panic(err)
	}
	s.Start()
	<-ran
	_ = s.Shutdown()
	fmt.Println("the report ran under its lock")
	// Output: the report ran under its lock
}

// One scheduler of the fleet leads and runs every job; the others skip.
func ExampleNewElector() {
	pool, done := pgtest.ExamplePool()
	defer done()
	ctx := context.Background()
	locker, _ := advisory.New(pool, advisory.Config{})

	election := "pgxlock-example-election-" + rand.Text() // unique to this run
	a, _ := pgxlockgocron.NewElector(locker, election, pgxlockgocron.Config{})
	b, _ := pgxlockgocron.NewElector(locker, election, pgxlockgocron.Config{})
	fmt.Println("a leads:", a.IsLeader(ctx) == nil)
	fmt.Println("b busy:", errors.Is(b.IsLeader(ctx), advisory.ErrNotAcquired))
	_ = a.Close(ctx) // resign
	fmt.Println("b leads:", b.IsLeader(ctx) == nil)
	_ = b.Close(ctx)
	// Output:
	// a leads: true
	// b busy: true
	// b leads: true
}
