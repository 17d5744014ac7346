-- The first attempt of an entry is kept in the entry's own row, written by the settle
-- that ends it: the row is rewritten by that settle anyway, so the common delivery (one
-- attempt, done) adds no inbox_attempt row, none of its two index entries and no
-- foreign-key check. Later attempts go to inbox_attempt as before. JSON of
-- failures::Attempt; NULL until the entry's first attempt ends. Binaries of schema 10
-- run on this one (they write every attempt to inbox_attempt and do not read this
-- column), so during a rolling upgrade their history view lacks the first attempts
-- the newer instances settled.
ALTER TABLE inbox_entry ADD COLUMN first_attempt TEXT;
