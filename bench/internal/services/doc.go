// Package services gives the benchmark suite the servers it compares against,
// each on loopback and each stopped by the Stop function it returns:
//
//   - PostgreSQL: the database DATABASE_URL names or, when it is unset, a
//     throwaway cluster started from the local server binaries (initdb into
//     a temporary directory, a free 127.0.0.1 port, durability off, run as
//     the OS user "postgres" when the process is root, because initdb refuses
//     root). This is a deliberately small copy of the main module's
//     internal/pglaunch, which bench, a separate module, cannot import.
//   - Redis: REDIS_ADDR (default 127.0.0.1:6379) when it answers PING, else a
//     redis-server child on a free port without persistence, when the binary
//     is installed.
//   - etcd: an etcd child (Debian's etcd-server) on free loopback ports with
//     its data directory in /dev/shm when that exists (etcd 3.4 has no
//     no-fsync switch; tmpfs makes its fsyncs cheap, as fsync=off does for
//     PostgreSQL and no persistence for Redis).
//
// A service that cannot be had is reported with the reason; the suite then
// marks its peers "unavailable" and carries on.
package services
