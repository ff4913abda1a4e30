-- shoal schema version 13: a failed run keeps the traceback of its last attempt (written by
-- settle with the error; at most 64 KiB, its end). Runs settled before this version have none.

ALTER TABLE runs ADD COLUMN traceback TEXT;
