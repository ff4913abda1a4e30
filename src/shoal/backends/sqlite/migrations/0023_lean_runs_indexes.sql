-- shoal schema version 23: on PostgreSQL, runs_namespace is dropped (see its 0023). SQLite keeps
-- it: a SQLite store is one app's file, and its writes of a run share a transaction with other
-- runs' (group commit), so an index entry costs it far less than a PostgreSQL update's does. The
-- version is recorded so both backends stay at the same number.
SELECT 1;
