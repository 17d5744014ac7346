-- When the current run's first NOT-YET answer came (reset by requeue): the not-yet
-- deadline counts from here, not from receipt.
ALTER TABLE inbox_entry ADD COLUMN not_yet_since INTEGER;
