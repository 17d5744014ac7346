-- Audit log v2 (SQLite): every repair action, who did it and how it ended.
CREATE TABLE inbox_audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    route   TEXT,
    subject TEXT    NOT NULL,
    outcome TEXT    NOT NULL,
    detail  TEXT
);
CREATE INDEX inbox_audit_at ON inbox_audit (at);
