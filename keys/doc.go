// Package keys names PostgreSQL advisory locks: a [Key] is a value in one of
// PostgreSQL's two advisory key spaces, derived from numbers, from a
// registered [Namespace], or from a string by a frozen SHA-256 derivation.
// The package does no database access and imports only the standard library.
//
// # Key spaces
//
// PostgreSQL has two advisory key spaces:
//
//   - [SpaceInt64]: one bigint, pg_advisory_lock(bigint). Built by [Int64],
//     [Hash] and [Namespace.Hash].
//   - [SpacePair]: two int4, pg_advisory_lock(int4, int4). Built by [Pair]
//     and [Namespace.Key].
//
// They never collide: the server's lock tag carries the space (pg_locks shows
// it as objsubid 1 or 2), so pg_advisory_lock(7, 42) and
// pg_advisory_lock(7::bigint<<32 | 42) are different locks although both show
// classid 7, objid 42. A Key keeps the space too: Int64(7<<32|42) != Pair(7, 42).
// Advisory calls choose the SQL function by [Key.Space].
//
// A Key is comparable and small; equal Keys are the same lock. The zero Key
// names no lock ([Key.IsZero]); lock calls reject it.
//
// # Derivations (frozen)
//
// Every derivation below is frozen: golden-value tests pin them, and a key
// computed today is the key computed by every later version and by other
// languages following the recipes. A different derivation would get a new
// version tag, never replace this one.
//
//   - Int64(v): the bigint v.
//   - Pair(a, b): the int4 pair (a, b).
//   - Namespace.Key(id): Pair(namespace id, id). Exact: distinct ids in a
//     namespace are distinct keys, with no hashing and no collision, and both
//     numbers are readable back from pg_locks. Up to 2^32 ids per namespace.
//   - Hash(s): the first 8 bytes of SHA-256 of the bytes of s, read as a
//     big-endian signed int64 (two's complement). Hash("") is a valid key, the
//     hash of no bytes (-2039914840885289964).
//   - Namespace.Hash(s), derivation version 1: the same reduction applied to
//     the domain-separated byte string below. An empty s is [ErrInvalid]: it
//     is nearly always a missing value.
//
// The namespaced input is, with | for concatenation:
//
//	"pgxlock:v1" | 0x00 | namespace id as 4 bytes, big-endian two's complement | 0x00 | s
//
// The version tag keeps these keys apart from Hash of any ordinary string (a
// plain string would have to begin with exactly these bytes, NULs included),
// and the fixed-width id keeps namespaces apart from each other. Only the id
// is hashed, not the name, so renaming a namespace keeps its keys.
//
// Strings are hashed as the bytes of the Go string, which for valid UTF-8 is
// its UTF-8 encoding. No Unicode normalization is applied: "é" as U+00E9
// (NFC) and as "e" U+0301 (NFD) are different keys, as are U+2126 OHM SIGN and
// U+03A9 OMEGA. Normalize strings yourself, the same way in every service, if
// visually equal strings must share a lock.
//
// # Other languages
//
// Node.js, for [Hash]:
//
//	createHash('sha256').update(s).digest().readBigInt64BE(0)
//
// PostgreSQL, for [Hash]:
//
//	('x' || left(encode(sha256(convert_to(s, 'UTF8')), 'hex'), 16))::bit(64)::bigint
//
// For [Namespace.Hash] with namespace id and string s:
//
//	// Node.js
//	const id4 = Buffer.alloc(4); id4.writeInt32BE(id);
//	createHash('sha256').update(Buffer.concat([
//	  Buffer.from('pgxlock:v1\0'), id4, Buffer.from([0]), Buffer.from(s, 'utf8'),
//	])).digest().readBigInt64BE(0)
//
//	-- PostgreSQL
//	('x' || left(encode(sha256(convert_to('pgxlock:v1', 'UTF8') || '\x00'::bytea
//	  || int4send(id) || '\x00'::bytea || convert_to(s, 'UTF8')), 'hex'), 16))::bit(64)::bigint
//
// PostgreSQL text cannot hold NUL bytes; hash such strings as bytea
// (sha256(bytes) in place of sha256(convert_to(...))). The tests run all of
// these recipes against a live server.
//
// # Collisions
//
// Pair keys do not collide: (namespace id, id) is the key itself. Hashed keys
// share the 2^64 bigint space with each other, across all namespaces, and
// with hand-picked [Int64] keys. For n distinct hashed strings in use, the
// birthday bound gives the chance that any two share a key as about
// n²/2^65:
//
//	n = 10^5   p ≈ 2.7e-10
//	n = 10^6   p ≈ 2.7e-8
//	n = 10^7   p ≈ 2.7e-6
//	n = 10^9   p ≈ 0.027
//
// A collision never breaks mutual exclusion: two resources that share a key
// merely serialize with each other (and a session holding one can take the
// other, since locks are re-entrant per session). Where even that is
// unacceptable, use exact pair keys: [Namespace.Key] with a numeric id.
//
// # Order
//
// [Compare] is a total order: space first (the zero Key, then SpaceInt64,
// then SpacePair), then values as signed integers (the bigint; a, then b).
// [Sort] and [Normalize] use it; multi-key locking takes keys in this order,
// which is what keeps callers that lock overlapping key sets from
// deadlocking each other. Processes in other languages that lock several of
// the same keys in one operation must use the same order.
//
// # Namespaces
//
// A [Namespace] is an int32 registered with a name through
// [RegisterNamespace], usually as a package-level variable with
// [MustRegisterNamespace]. The registry is process-wide and append-only: one
// name per id and one id per name ([ErrNamespaceConflict] otherwise);
// registering the same pair again is a no-op. It cannot see other processes,
// so keep the table of ids in one place shared by every service that uses the
// database.
//
// # pg_locks
//
// Advisory rows in pg_locks (locktype = 'advisory') show a bigint key k as
// classid = high 32 bits, objid = low 32 bits, objsubid = 1, and an int4 pair
// (a, b) as classid = a, objid = b (their uint32 bit patterns), objsubid = 2.
// [FromPgLocks] decodes a row, negative keys included; [Key.PgLocks] is its
// inverse, for looking up one key.
//
// # Logging
//
// [Key.String] prints numbers only: "int64:-42", "pair:7,42", or
// "ns:billing(7)/42" when the first number of a pair is a registered
// namespace. A Key never holds the string it was hashed from, so neither
// String nor anything else in this package can reveal it. The number is a
// one-way hash, but a guessable source (an e-mail address, a national id) can
// be confirmed by hashing candidates: treat such keys as pseudonymous, not
// anonymous.
//
// # Errors and panics
//
// Bad input returns an error wrapping [ErrInvalid]; registry disagreements
// wrap [ErrNamespaceConflict]. Nothing panics except [MustRegisterNamespace],
// which panics with the error RegisterNamespace would have returned.
package keys
