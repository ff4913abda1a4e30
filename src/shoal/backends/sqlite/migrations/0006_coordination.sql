-- shoal schema version 6: coordination (shoal.coord.base): locks, membership, meters.
-- Every key is scoped by the app's namespace. Times are the app's clock (REAL), never SQLite's.

-- invariant 7: a key has at most one holder with a live lease; tokens strictly increase. A row
-- outlives its holder (holder NULL) because it keeps the key's fencing counter.
CREATE TABLE locks (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT,                         -- NULL: released (a lease that ended holds nothing)
    token      INTEGER NOT NULL DEFAULT 0,   -- the last fencing token granted on this key
    expires_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

-- The FIFO queue of each key. A waiter of several keys has one row per key, all with its ticket.
CREATE TABLE lock_waiters (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    ticket     INTEGER NOT NULL,
    expires_at REAL NOT NULL,                -- a waiter that stops asking leaves the queue then
    PRIMARY KEY (namespace, key, holder)
) WITHOUT ROWID;
CREATE INDEX lock_waiters_queue ON lock_waiters (namespace, key, ticket);

-- The last ticket given in a namespace: tickets are ordered across keys.
CREATE TABLE lock_tickets (
    namespace TEXT PRIMARY KEY,
    ticket    INTEGER NOT NULL
) WITHOUT ROWID;

-- invariant 8: members heartbeat; a row ends at expires_at. held: the generation it acts on.
CREATE TABLE members (
    namespace  TEXT NOT NULL,
    member     TEXT NOT NULL,
    joined_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    held       INTEGER,
    PRIMARY KEY (namespace, member)
) WITHOUT ROWID;

-- The roster (JSON array of sorted member ids) and its generation, one row per namespace.
CREATE TABLE rosters (
    namespace  TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    members    TEXT NOT NULL
) WITHOUT ROWID;

-- invariant 9: a debt in milliseconds per key, drained by the app's clock.
CREATE TABLE meters (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    debt       REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
