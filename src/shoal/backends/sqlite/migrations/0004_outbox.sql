-- shoal schema version 4: the outbox, side effects recorded with the step that sent them.

CREATE TABLE outbox (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    seq          INTEGER NOT NULL,   -- the step that sent it
    idx          INTEGER NOT NULL,   -- its place among that step's entries
    topic        TEXT NOT NULL,
    payload      TEXT,
    created_at   REAL NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      REAL NOT NULL,      -- due then; a delivering instance holds it until then
    delivered_at REAL,
    dead         INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    UNIQUE (run_id, seq, idx)        -- invariant 3: a step's entries exist once
);
CREATE INDEX outbox_due ON outbox (namespace, next_at)
    WHERE delivered_at IS NULL AND dead = 0;
CREATE INDEX outbox_dead ON outbox (namespace, created_at, id) WHERE dead = 1;
