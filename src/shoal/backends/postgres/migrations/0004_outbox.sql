-- shoal schema version 4: the outbox, side effects recorded with the step that sent them. The same
-- table as SQLite's; times are the app's Clock (double precision) and payloads are kept as their
-- JSON text.

CREATE TABLE outbox (
    id           text PRIMARY KEY,
    namespace    text NOT NULL,
    run_id       text NOT NULL,
    seq          integer NOT NULL,   -- the step that sent it
    idx          integer NOT NULL,   -- its place among that step's entries
    topic        text NOT NULL,
    payload      text,
    created_at   double precision NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_at      double precision NOT NULL,  -- due then; a delivering instance holds it until then
    delivered_at double precision,
    dead         boolean NOT NULL DEFAULT false,
    error        text,
    UNIQUE (run_id, seq, idx)        -- invariant 3: a step's entries exist once (and prune's probe)
);
-- the claim scan: only entries still to deliver are indexed, so its cost does not grow with
-- delivered ones, and it reads due entries only
CREATE INDEX outbox_due ON outbox (namespace, next_at) WHERE delivered_at IS NULL AND NOT dead;
CREATE INDEX outbox_dead ON outbox (namespace, created_at, id) WHERE dead;
