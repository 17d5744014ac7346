-- Prototype migration 0011 (PostgreSQL): the key table. Applied on top of 0001..0010.
-- One narrow row per (route, correlation key) with unresolved work. No index covers
-- head_id, state, due_at or lease_*, so every change of them is a HOT update.
CREATE TABLE inbox_key (
    route            TEXT     NOT NULL,
    correlation_key  TEXT     NOT NULL,   -- '#<id>' for an entry without a key
    slot             SMALLINT NOT NULL,   -- fixed at insert: hash of the key mod 256
    head_id          BIGINT   NOT NULL,   -- ready/leased/blocked: the key's oldest unresolved entry
                                          -- moving: a lower bound (every unresolved entry has id >= it)
    state            TEXT     NOT NULL,
    due_at           BIGINT   NOT NULL,   -- ready: the head's next_attempt_at
    lease_owner      TEXT,
    lease_token      BIGINT   NOT NULL DEFAULT 0,
    lease_expires_at BIGINT,
    CONSTRAINT inbox_key_state CHECK (state IN ('ready', 'leased', 'blocked', 'moving')),
    CONSTRAINT inbox_key_leased CHECK (state <> 'leased' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    PRIMARY KEY (route, correlation_key)
) WITH (fillfactor = 50);
CREATE INDEX inbox_key_slot ON inbox_key (route, slot);

-- Who claims which slots (fencing). The prototype filters on slot = ANY($slots) only.
CREATE TABLE inbox_slot (
    route            TEXT     NOT NULL,
    slot             SMALLINT NOT NULL,
    owner            TEXT,
    epoch            BIGINT   NOT NULL DEFAULT 0,
    lease_expires_at BIGINT,
    PRIMARY KEY (route, slot)
);

-- The slot of a key: 0..255.
CREATE FUNCTION inbox_key_slot(key TEXT) RETURNS SMALLINT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (((hashtextextended(key, 0) % 256) + 256) % 256)::smallint $$;

-- The head of a key, found in a snapshot taken after this call began: the oldest entry
-- of (route, key) from id `from_id` up, other than `except_id`, that is OPEN, or PARKED
-- where parked blocks the key. One row; all NULL if there is none.
--
-- Why a function: the caller holds the key's advisory lock exclusively when it calls
-- this, but its own statement's snapshot was taken before the lock was granted, so it
-- may miss an insert that committed in between. A VOLATILE PL/pgSQL function takes a
-- new snapshot for each query it runs (READ COMMITTED), after the lock.
CREATE FUNCTION inbox_key_probe(p_route TEXT, p_key TEXT, from_id BIGINT, except_id BIGINT, parked_blocks BOOLEAN,
                                OUT id BIGINT, OUT status TEXT, OUT due BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_key LIKE '#%' THEN   -- a synthetic key: the entry is its key's only one
        RETURN;
    END IF;
    SELECT e.id, e.status, e.next_attempt_at INTO id, status, due
    FROM inbox_entry e
    WHERE e.route = p_route AND e.correlation_key = p_key AND e.id >= from_id AND e.id <> except_id
      AND e.status IN ('OPEN', 'PARKED') AND (e.status = 'OPEN' OR parked_blocks)
    ORDER BY e.id LIMIT 1;
END $$;

-- The head advance of a settle: try the key's lock exclusively (never waiting); if
-- granted, the next head in a fresh snapshot. locked = false: an insert (or requeue)
-- of the key is in flight; the caller leaves the key row 'moving'.
CREATE FUNCTION inbox_key_advance(p_route TEXT, p_key TEXT, from_id BIGINT, except_id BIGINT, parked_blocks BOOLEAN,
                                  OUT locked BOOLEAN, OUT id BIGINT, OUT status TEXT, OUT due BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    locked := pg_try_advisory_xact_lock(hashtextextended(p_route || ':' || p_key, 0));
    IF locked THEN
        SELECT p.id, p.status, p.due INTO id, status, due FROM inbox_key_probe(p_route, p_key, from_id, except_id, parked_blocks) p;
    END IF;
END $$;

-- The first attempt that ends an entry writes no inbox_attempt row: its summary is here.
ALTER TABLE inbox_entry ADD COLUMN attempt_owner TEXT, ADD COLUMN attempt_started_at BIGINT,
    ADD COLUMN attempt_duration_ms BIGINT, ADD COLUMN attempt_plugin TEXT;
