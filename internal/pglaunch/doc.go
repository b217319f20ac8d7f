// Package pglaunch starts a throwaway PostgreSQL cluster from locally installed server
// binaries: a fresh data directory in a temporary directory, a free loopback port, settings
// tuned for tests, and a Stop that leaves nothing behind.
//
// It does not import "testing": the test harness (internal/pgtest), examples and a CLI share
// it.
//
// # Finding the binaries
//
// [FindBinDir] asks `pg_config --bindir` first and uses it when that directory holds initdb
// (Debian's pg_config may describe a client-only install); otherwise it takes the newest
// /usr/lib/postgresql/<version>/bin, then initdb on PATH, then the newest
// /usr/pgsql-<version>/bin.
//
// # Running as root
//
// initdb and postgres refuse to run as root. When the calling process runs as root, every
// PostgreSQL command runs as [Options.OSUser] ("postgres" by default) through
// exec.Cmd's SysProcAttr.Credential, and the temporary directory is owned by that user. The
// temporary directory's parent must be traversable by that user; os.TempDir() is used when
// it is, else /tmp.
//
// # What a cluster looks like
//
// One temporary directory (pglaunch-*) per cluster holds the data directory (data/), the
// server log (server.log), the unix socket and an owner file naming the launching process.
// The server listens on 127.0.0.1 only, on a port picked by binding 127.0.0.1:0 (a port
// taken in between is retried with a new one), with trust authentication for the user
// "postgres". Durability is off (fsync, synchronous_commit, full_page_writes): a crashed
// cluster is thrown away, never recovered. [Options.Settings] adds postgresql.conf settings.
//
// # Template cache
//
// initdb takes about a second. The first [Start] for a given set of binaries keeps a
// pristine copy of the fresh data directory in the user's cache directory
// (<os.UserCacheDir>/pglaunch/<key>, about 40 MB), published with an atomic rename; later
// starts copy it instead of running initdb. A cluster that will not start from the cached
// copy discards the cache entry and falls back to initdb. [Options.NoTemplateCache] turns the
// cache off; [Options.CacheDir] moves it.
//
// # Standby and failover
//
// [Cluster.StartStandby] makes a streaming standby of a running cluster (pg_basebackup -R
// through a physical replication slot, started on its own port, same settings),
// asynchronous or synchronous ([StandbyOptions]). [Cluster.PauseReplication] and
// [Cluster.ResumeReplication] stop and restart the WAL stream deterministically (so a test
// can make a promoted standby miss the primary's last commits), [Cluster.Promote] ends
// recovery and waits until the standby accepts writes (on timeline 2: the first 8 hex
// digits of pg_walfile_name(pg_current_wal_lsn())), and [Cluster.Stop] of the old primary
// cuts its sessions (immediate mode). [MultiHostDSN] lists several clusters with
// target_session_attrs=read-write, so pgx connects to whichever accepts writes. Starting a
// standby took 0.7-2 s here (base backup, start, first streaming), about as long as a
// primary.
//
// # Clean-up
//
// [Cluster.Stop] stops the server in immediate mode and removes the temporary directory; it
// is idempotent. A process that dies without calling Stop (a test binary killed by -timeout)
// leaves a running server behind: the next [Start] on the machine finds such clusters by
// their owner file, stops them and removes their directories.
package pglaunch
