package lease

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// This file holds how the package names things: quoted identifiers, random
// lease ids, the default owner, the NOTIFY channel and payload.

// qualify returns the quoted, optionally schema-qualified name of a relation.
// An empty schema leaves the name to the connection's search_path.
func qualify(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// quote returns one quoted identifier (a column, an index, a channel).
func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// newID returns a random RFC 4122 version 4 UUID in its text form. It names one
// acquisition: the owner token of a column lease, the lease_id of a
// lock-manager row, the id of a writer's intent. The text form is accepted by
// both text and uuid columns, so a column lease's owner column may be either.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+): it crashes the program instead.
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// isOwnerToken reports whether s has the form newID gives: a lowercase
// RFC 4122 version 4 UUID in its 36-character text form. A text owner column
// compares it byte for byte and a uuid column parses it; holding stored
// owners to this one form keeps an edited owner (other case, braces, no
// dashes, which a uuid column would read as the same value) from matching.
func isOwnerToken(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		case 14:
			if c != '4' {
				return false
			}
		case 19:
			if c != '8' && c != '9' && c != 'a' && c != 'b' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// defaultOwner is the owner label used when neither ManagerConfig.Owner nor
// AcquireOptions.Owner is set: "<hostname>:<pid>", enough for an operator to
// find the process in List and for ReleaseAll after a restart on the same host
// (with a different pid, so a restarted process does not release its
// predecessor's leases by accident).
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// defaultChannel derives a NOTIFY channel from the qualified table name, so
// that two lock-manager tables in one database do not wake each other's
// waiters. The result is a valid identifier well under 63 bytes.
func defaultChannel(qualifiedTable string) string {
	sum := sha256.Sum256([]byte(qualifiedTable))
	return "pgxlock_lease_" + hex.EncodeToString(sum[:8])
}

// wakeKey is the NOTIFY payload for a resource: the md5 of its UTF-8 bytes
// as lowercase hex, computed by the server in SQL
// (md5(convert_to(resource, 'UTF8')): md5(text) would hash the bytes of the
// database's encoding, which differ from UTF-8's for non-ASCII text on a
// LATIN1 or EUC_JP database) and here for matching. A fixed-size payload keeps long or
// hostile resource names out of the 8000-byte payload limit and out of any
// tool that prints notifications.
func wakeKey(resource string) string {
	sum := md5.Sum([]byte(resource))
	return hex.EncodeToString(sum[:])
}
