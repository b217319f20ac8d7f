-- A backfill that takes a moment, so that the other processes visibly wait for the lock.
INSERT INTO accounts (id, email)
SELECT i, 'user' || i || '@example.com' FROM generate_series(1, 50000) AS i;
