-- shoal schema version 2: pauses, the human decisions runs wait for (approvals).
-- The same table and columns as SQLite's; times are the app's Clock (double precision) and JSON
-- values are kept as their text, as in version 1.

CREATE TABLE pauses (
    id           text PRIMARY KEY,
    namespace    text NOT NULL,
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    name         text NOT NULL,
    request      text,
    status       text NOT NULL CHECK (status IN ('pending', 'resolved')),  -- exactly once
    decision     text,                -- JSON {"approved", "data", "by", "reason"}
    created_at   double precision NOT NULL,
    expires_at   double precision,
    resolved_at  double precision,
    notified     boolean NOT NULL DEFAULT false,
    notify_until double precision     -- an instance is sending its notification until then
);
CREATE INDEX pauses_pending ON pauses (namespace, created_at, id) WHERE status = 'pending';
CREATE INDEX pauses_expiring ON pauses (namespace, expires_at) WHERE status = 'pending';
CREATE INDEX pauses_unnotified ON pauses (namespace, created_at, id) WHERE NOT notified;
CREATE INDEX pauses_resolved ON pauses (namespace, resolved_at) WHERE status = 'resolved';
CREATE INDEX pauses_of_run ON pauses (run_id) WHERE status = 'pending';
