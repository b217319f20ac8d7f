// Package pgbouncer starts a throwaway PgBouncer in front of a PostgreSQL server, for
// tests that must show how the library behaves behind a connection proxy (transaction
// pooling in particular, where session-level advisory locks stop excluding anybody).
//
// It does not import "testing": tests, examples and CI scripts share it.
//
// # What Start does
//
// [Start] parses the upstream DSN (URL or key=value form) for host, port, user, password
// and database, writes pgbouncer.ini and userlist.txt into a new temporary directory
// (pgbouncer-*), and runs the pgbouncer binary in the foreground on a free port of
// 127.0.0.1 (a port taken in between is retried with another), with auth_type=trust, the
// requested pool_mode (transaction by default) and one wildcard database entry that logs
// in to the upstream server as the upstream user. It returns once a client can connect
// through it and run a query, so a broken upstream is reported by Start, not by the first
// test. [Bouncer.DSN] is the client side; [Bouncer.Stop] kills the process, reaps it and
// removes the directory.
//
// # Running as root
//
// PgBouncer refuses to run as root. When the calling process is root, pgbouncer runs as
// [Options.OSUser] ("postgres" by default, else "nobody") through exec.Cmd's
// SysProcAttr.Credential, and the temporary directory is owned by that user, as package
// internal/pglaunch does for PostgreSQL.
//
// # Leftovers
//
// Each directory holds an owner file with the PID of the process that started the
// bouncer. A process killed before Stop leaves its pgbouncer running; the next Start on
// the machine finds directories whose owner is gone, kills their pgbouncer (found through
// its pidfile and checked by name) and removes them.
//
// # The binary
//
// The binary is looked up on PATH, then in /usr/sbin, /usr/local/sbin and
// /usr/local/bin (Debian installs it in /usr/sbin, which a non-root PATH often lacks).
// When it is missing, Start returns an error matching [ErrNoBinary] that says how to get
// it: `bash .ci/setup`, which runs `apt-get install -y pgbouncer`.
package pgbouncer
