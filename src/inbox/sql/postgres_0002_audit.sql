-- Audit log v2 (PostgreSQL): every repair action, who did it and how it ended.
-- `actor` is a token name, `loopback` (unauthenticated local mode) or `cli:<user>`;
-- `subject` names the entries or the filter acted on.
CREATE TABLE inbox_audit (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      BIGINT NOT NULL,
    actor   TEXT   NOT NULL,
    action  TEXT   NOT NULL,
    route   TEXT,
    subject TEXT   NOT NULL,
    outcome TEXT   NOT NULL,
    detail  TEXT
);
CREATE INDEX inbox_audit_at ON inbox_audit (at);
