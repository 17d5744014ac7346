-- Route members (v14, PostgreSQL). Every instance that relays a route says so here
-- about once a second (`seen_at`, the database's clock, so instances' clocks never
-- compare). The live members of a route, in the order of their names, divide its keys
-- by hash: each instance's ordered claims look only at the keys of its own part, so
-- instances stop reading and try-locking the keys the others work.
--
-- It decides where an instance looks, never what keeps a key's order: the key locks
-- and the in-flight check of every claim do. Two instances whose views of the members
-- differ for a moment (one just came or went) look at some keys both (as before this
-- table) or leave some keys to the next second. Older binaries ignore the table and
-- claim every key, as they did.
CREATE TABLE inbox_route_member (
    route   TEXT        NOT NULL,
    owner   TEXT        NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (route, owner)
);
