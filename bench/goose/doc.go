// Package goose times a rollout of 8 replicas that all run goose's
// migrations at start-up, under goose's own PostgreSQL session locker
// (polling every second, its fastest setting) and under
// contrib/goose's blocking locker. Run it with
//
//	cd bench && go test ./goose -run '^$' -bench UpRace -benchtime 3x
//
// It reports the time until all 8 callers of Provider.Up have returned for
// each locker, and their ratio, measured in the same run (the two lockers
// alternate within each iteration).
package goose
