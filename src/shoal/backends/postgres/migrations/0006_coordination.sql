-- shoal schema version 6: coordination (shoal.coord.base): locks, membership, meters. The same
-- tables and columns as SQLite's. Every key is scoped by the app's namespace. Times are the app's
-- clock (double precision), never the server's.
--
-- Concurrency (shoal.backends.postgres.coord): a lock key's row is locked (FOR UPDATE, keys in
-- "C" order) before anything of that key is read or written, its waiter rows included; the
-- membership of a namespace is serialized by an advisory transaction lock; meter rows are locked
-- in "C" order. Lock and meter rows are never deleted, so the lock order is the same for all.

-- invariant 7: a key has at most one holder with a live lease; tokens strictly increase. A row
-- outlives its holder (holder NULL) because it keeps the key's fencing counter.
CREATE TABLE locks (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text,                              -- NULL: released (an ended lease holds nothing)
    token      bigint NOT NULL DEFAULT 0,         -- the last fencing token granted on this key
    expires_at double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, key)
);

-- The FIFO queue of each key. A waiter of several keys has one row per key, all with its ticket.
CREATE TABLE lock_waiters (
    namespace  text NOT NULL,
    key        text NOT NULL,
    holder     text NOT NULL,
    ticket     bigint NOT NULL,
    expires_at double precision NOT NULL,         -- a waiter that stops asking leaves the queue
    PRIMARY KEY (namespace, key, holder)
);
CREATE INDEX lock_waiters_queue ON lock_waiters (namespace, key, ticket);

-- The last ticket given in a namespace: tickets are ordered across keys.
CREATE TABLE lock_tickets (
    namespace text PRIMARY KEY,
    ticket    bigint NOT NULL
);

-- invariant 8: members heartbeat; a row ends at expires_at. held: the generation it acts on.
CREATE TABLE members (
    namespace  text NOT NULL,
    member     text NOT NULL,
    joined_at  double precision NOT NULL,
    expires_at double precision NOT NULL,
    held       bigint,
    PRIMARY KEY (namespace, member)
);

-- The roster (member ids in "C" order, as Python sorts them) and its generation, per namespace.
CREATE TABLE rosters (
    namespace  text PRIMARY KEY,
    generation bigint NOT NULL,
    members    text[] NOT NULL
);

-- invariant 9: a debt in milliseconds per key, drained by the app's clock.
CREATE TABLE meters (
    namespace  text NOT NULL,
    key        text NOT NULL,
    debt       double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);
