package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// uniqueSum hashes the test name with 16 random bytes.
func uniqueSum(t testing.TB) [32]byte {
	var r [16]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand, Go 1.24+)
	return sha256.Sum256(append([]byte(t.Name()), r[:]...))
}

// UniqueInt64 returns an advisory-lock key for this test: the first 8 bytes, big-endian,
// of SHA-256(test name + 16 random bytes). Each call returns a new key. Advisory keys are
// database-wide, so tests must not share hard-coded numbers.
func UniqueInt64(t testing.TB) int64 {
	sum := uniqueSum(t)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// UniqueInt32 is [UniqueInt64] for int4 keys (the first 4 bytes of the hash).
func UniqueInt32(t testing.TB) int32 {
	sum := uniqueSum(t)
	return int32(binary.BigEndian.Uint32(sum[:4]))
}

// Schema creates an empty schema "t_<12 random hex>" through pool and returns its name
// (a plain identifier, no quoting needed). At cleanup it is dropped with CASCADE through a
// separate connection, under a fresh context, after the test's later cleanups; a failed
// drop fails the test. The search_path is not changed: qualify names with the schema.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := "t_" + randomHex(6)
	ident := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := checkerConn(ctx, pool)
		if err != nil {
			t.Errorf("pgtest: drop schema %s: connect: %v", name, err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		// A test that left a transaction open on the schema's tables must not stall the
		// cleanup for the whole context.
		if _, err := conn.Exec(ctx, "SET lock_timeout = '10s'"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
			return
		}
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}
