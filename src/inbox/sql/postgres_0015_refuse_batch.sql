-- A batch insert that commits alone (v15, PostgreSQL). The group commit's batch of
-- inserts runs as one statement without BEGIN and COMMIT around it (an implicit
-- transaction: one round trip instead of three). That is only right when every row of
-- the batch has its answer in the statement: a new row, or a redelivery of a row the
-- statement sees. A row with neither (a dedup-key conflict, which must park a row of
-- its own in the batch's order, or a row of the same key committed by another insert
-- after this statement's snapshot) calls this function, whose error rolls the whole
-- statement back; the caller then inserts the batch in a transaction as before.
--
-- Only adds a function: older binaries run on this schema as they did.
CREATE OR REPLACE FUNCTION inbox_refuse_batch(reason TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'inlet: the batch goes one by one: %', reason USING ERRCODE = 'INLT1';
END
$$;
