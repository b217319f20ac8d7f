package advisory

import "testing"

func TestSQLEndsTransaction(t *testing.T) {
	ends := map[string]string{
		"COMMIT":                                   "COMMIT",
		"commit":                                   "COMMIT",
		"  -- a comment\n commit":                  "COMMIT",
		"/* a /* nested */ one */ END":             "END",
		"end transaction":                          "END",
		"ROLLBACK":                                 "ROLLBACK",
		"rollback and chain":                       "ROLLBACK",
		"BEGIN":                                    "BEGIN",
		"start transaction":                        "START",
		"ABORT":                                    "ABORT",
		"PREPARE TRANSACTION 'x'":                  "PREPARE TRANSACTION",
		"INSERT INTO t VALUES (1); COMMIT":         "COMMIT",
		"SELECT '\\'; COMMIT":                      "COMMIT", // a backslash is ordinary outside E''
		"SELECT 'a;b'; commit":                     "COMMIT",
		"SELECT $$ ; $$ ; END":                     "END",
		"SELECT $tag$ ;commit $tag$; rollback":     "ROLLBACK",
		"SELECT E'\\' ; commit'; SELECT 1; COMMIT": "COMMIT",
		"SELECT \"a;\"\"b\" FROM t; begin":         "BEGIN",
	}
	for sql, want := range ends {
		got, ok := sqlEndsTransaction(sql)
		if !ok || got != want {
			t.Errorf("%q: got %q, %v; want %q, true", sql, got, ok, want)
		}
	}
	fine := []string{
		"",
		"INSERT INTO t VALUES ($1)",
		"SELECT 'commit'",
		"SELECT 1 -- ; commit",
		"SELECT 1 /* ; commit */",
		"SELECT $$; COMMIT$$",
		"SELECT $q$; COMMIT$q$",
		"SELECT $1::int; SELECT $2",
		"SAVEPOINT s",
		"ROLLBACK TO SAVEPOINT s",
		"rollback to s",
		"RELEASE SAVEPOINT s",
		"PREPARE q AS SELECT 1",
		"SELECT endpoint FROM commits",
		"UPDATE t SET v = 'BEGIN'",
		"SELECT E'it\\'s; commit'",
		"SELECT \"commit\" FROM t",
	}
	for _, sql := range fine {
		if w, ok := sqlEndsTransaction(sql); ok {
			t.Errorf("%q refused as %q", sql, w)
		}
	}
}

func FuzzSQLEndsTransaction(f *testing.F) {
	f.Add("SELECT 1; COMMIT")
	f.Add("SELECT $a$ x $a$ /* y */ -- z\n'q''r' \"s\"")
	f.Fuzz(func(t *testing.T, sql string) {
		sqlEndsTransaction(sql) // must not panic or loop
	})
}
