-- shoal schema version 2: pauses, the human decisions runs wait for (approvals).

CREATE TABLE pauses (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    request      TEXT,
    status       TEXT NOT NULL,       -- pending -> resolved, exactly once
    decision     TEXT,                -- JSON {"approved", "data", "by", "reason"}
    created_at   REAL NOT NULL,
    expires_at   REAL,
    resolved_at  REAL,
    notified     INTEGER NOT NULL DEFAULT 0,
    notify_until REAL                 -- an instance is sending its notification until then
);
CREATE INDEX pauses_pending ON pauses (namespace, created_at, id) WHERE status = 'pending';
CREATE INDEX pauses_expiring ON pauses (namespace, expires_at) WHERE status = 'pending';
CREATE INDEX pauses_unnotified ON pauses (namespace, created_at, id) WHERE notified = 0;
CREATE INDEX pauses_resolved ON pauses (namespace, resolved_at) WHERE status = 'resolved';
CREATE INDEX pauses_of_run ON pauses (run_id) WHERE status = 'pending';
