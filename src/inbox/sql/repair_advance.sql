UPDATE repair_job SET
    last_id = $3,
    moved = moved + $4,
    state = CASE WHEN $5 THEN 'done' ELSE state END,
    finished_at = CASE WHEN $5 THEN $6 ELSE finished_at END,
    owner = CASE WHEN $5 THEN NULL ELSE owner END,
    lease_expires_at = $6 + $7,
    updated_at = $6
WHERE id = $1 AND owner = $2 AND state = 'running'
