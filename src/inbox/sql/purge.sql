DELETE FROM inbox_entry WHERE id IN (
    SELECT id FROM inbox_entry
    WHERE status IN ('DONE', 'IGNORED') AND finished_at < $1
    ORDER BY finished_at
    LIMIT $2)
