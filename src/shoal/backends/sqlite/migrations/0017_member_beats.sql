-- shoal schema version 17: what a console shows of the replicas (coordination_view).
--
-- A member row keeps the time of its latest heartbeat (beat_at, the heartbeat's now) and the code
-- version its instance runs: the console lists live instances with both. Instances of older code
-- (started before this migration) leave both NULL; a heartbeat of newer code fills them.
--
-- locks_held: the keys a holder holds (or held until its lease ended and nobody released it),
-- so that the console finds them without walking every key ever locked (a lock row stays for
-- ever: it keeps the key's fencing counter).

ALTER TABLE members ADD COLUMN beat_at REAL;
ALTER TABLE members ADD COLUMN version TEXT;

CREATE INDEX locks_held ON locks (namespace, key) WHERE holder IS NOT NULL;
