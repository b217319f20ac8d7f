package keys

import "fmt"

// FromPgLocks decodes the key of an advisory lock from its pg_locks columns
// (locktype = 'advisory'): classid and objid are oid (uint32), objsubid is
// int2. PostgreSQL shows
//
//   - a bigint key k with classid = high 32 bits of k, objid = low 32 bits,
//     objsubid = 1;
//   - an int4 pair (a, b) with classid = a, objid = b (each as its uint32 bit
//     pattern, so -1 shows as 4294967295), objsubid = 2.
//
// Negative keys therefore decode exactly. Any other objsubid returns
// ErrInvalid. The query reads the columns as they are:
//
//	SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory'
func FromPgLocks(classid, objid uint32, objsubid int16) (Key, error) {
	v := int64(uint64(classid)<<32 | uint64(objid))
	switch objsubid {
	case int16(SpaceInt64), int16(SpacePair):
		return Key{space: Space(objsubid), v: v}, nil
	}
	return Key{}, fmt.Errorf("%w: pg_locks objsubid %d is not an advisory key space (1 = bigint, 2 = int4 pair)",
		ErrInvalid, objsubid)
}

// PgLocks returns the pg_locks columns (classid, objid, objsubid) that show
// k: the inverse of FromPgLocks. For the zero Key it returns (0, 0, 0),
// which matches no advisory lock row. It lets a caller look for one key:
//
//	SELECT granted FROM pg_locks
//	WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = $3
func (k Key) PgLocks() (classid, objid uint32, objsubid int16) {
	if k.space == 0 {
		return 0, 0, 0
	}
	return uint32(uint64(k.v) >> 32), uint32(k.v), int16(k.space)
}
