//! The migration lint: every migration both stores embed (`sql/{postgres,sqlite}_*.sql`)
//! held to the rules UPGRADING.md writes for them, run as a unit test. Each finding
//! names the file and the rule:
//!
//! - `released-unchanged`: a released migration is never edited (its checksum is
//!   recorded wherever it ran); [`RELEASED`] lists them with their SHA-256.
//! - `expand-only-adds`: a migration that declares `compatible_from` (expand: older
//!   binaries run on it) drops nothing (but an index it builds again), renames nothing,
//!   changes no column's type, sets no `NOT NULL`, adds no `NOT NULL` column without a
//!   default, no constraint and no unique index, truncates nothing.
//! - `index-concurrently`: a PostgreSQL migration after the released ones builds an
//!   index on a table it does not create with `CREATE INDEX CONCURRENTLY`, in a
//!   migration declared `outside_transaction` (a plain build blocks the table's writes
//!   for as long as it takes).
//! - `concurrently-outside-transaction`: `CONCURRENTLY` only in such a migration
//!   (PostgreSQL refuses it in a transaction).
//! - `outside-transaction-idempotent`: a migration outside a transaction holds only
//!   statements that running again completes: `IF [NOT] EXISTS`, and each
//!   `CREATE INDEX CONCURRENTLY x` (named) right after `DROP INDEX CONCURRENTLY IF
//!   EXISTS x`, which removes the INVALID index a failed build leaves (`IF NOT EXISTS`
//!   would keep it).
//! - `outside-transaction-for-concurrently`: a migration gives up all-or-nothing only
//!   for something `CONCURRENTLY`.
//! - `sqlite-in-transaction`: SQLite's migrations all run in the run's transaction.
//!
//! Statements are matched word by word in their normal form ([`sql_text`]: no
//! comments, empty literals, lowercase).

use std::fmt;

use super::schema::{self, Migration};
use super::sql_text;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    fn prefix(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// The released migrations and the SHA-256 of each one's SQL. A migration joins this
/// list with the release that ships it, and never changes after.
const RELEASED: &[(Backend, i64, &str)] = &[
    (Backend::Postgres, 1, "579337ff2e7199a2e51b6ab90ecdc45fbc4f52e11fdf42e715d3dab7f7b266ae"),
    (Backend::Postgres, 2, "ba088cf017b7ad747ffd6d82f4eb178d5bd3ab177b9792065c5cb58e9e5ee6c7"),
    (Backend::Postgres, 3, "9abbb79a7c0ea5bd2fac518a7318362fabdf3dfe4dadb1f405232ae25d447555"),
    (Backend::Postgres, 4, "23608fca94b7e829b9c3d1e60fcca92f132f8754bf238ed75af7217933826602"),
    (Backend::Postgres, 5, "ac8299849ec0404f640672f07c3759de08de8d37f4e10e608a770f1d8b94125b"),
    (Backend::Postgres, 6, "a2d3847268b77070bdf66789e94d12f254c0bcd89551c6785c349d7ececf33f6"),
    (Backend::Postgres, 7, "7a8bbe51d91687f2cff2777328bf35a1d9069e06c160dc92a0c1086eb945a8fd"),
    (Backend::Postgres, 8, "6f269fe18f737a3b1cf681f3c3811f766653c28650ec2accb4363dd16eb146f8"),
    (Backend::Postgres, 9, "64c117dc18e838c9cae9c8d9ee500563bdc2a39667779760aebdf12534e97720"),
    (Backend::Sqlite, 1, "467ab277158778578b5aaf866b0314d4e3107aeb44c82bfd3089ff89427a1375"),
    (Backend::Sqlite, 2, "5a32893809bdf7a72e82884c077c1d7d20215dd43fa86fdabfdd9448150558d8"),
    (Backend::Sqlite, 3, "0848157cd5e5a2de89d5ab417c62426959abb8a07e8347bef9259caa2f54b006"),
    (Backend::Sqlite, 4, "6f06afe64fabdd1a6d2292603edf2bb1fcfbd6af4d1e48900572d6c49ec37d0c"),
    (Backend::Sqlite, 5, "29163befc36ed72b0e8c2f9cf822a4f96ec4e4f56892ae8b0b244fc05559d529"),
    (Backend::Sqlite, 6, "eb95d8a9efeacb9daaf47d4671aa78b25c489e1d70138f0edb1ffed536d1d1cb"),
    (Backend::Sqlite, 7, "7a8bbe51d91687f2cff2777328bf35a1d9069e06c160dc92a0c1086eb945a8fd"),
    (Backend::Sqlite, 8, "16c438eafb8ac0398ee7999cb97111a5a935b8c8447da215d71cc1e7bc943df2"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    ReleasedUnchanged,
    ExpandOnlyAdds,
    IndexConcurrently,
    ConcurrentlyOutsideTransaction,
    OutsideTransactionIdempotent,
    OutsideTransactionForConcurrently,
    SqliteInTransaction,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::ReleasedUnchanged => "released-unchanged",
            Rule::ExpandOnlyAdds => "expand-only-adds",
            Rule::IndexConcurrently => "index-concurrently",
            Rule::ConcurrentlyOutsideTransaction => "concurrently-outside-transaction",
            Rule::OutsideTransactionIdempotent => "outside-transaction-idempotent",
            Rule::OutsideTransactionForConcurrently => "outside-transaction-for-concurrently",
            Rule::SqliteInTransaction => "sqlite-in-transaction",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Finding {
    file: String,
    rule: Rule,
    message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: rule {}: {}", self.file, self.rule, self.message)
    }
}

/// The file a migration is embedded from.
fn file(backend: Backend, m: &Migration) -> String {
    format!("src/inbox/sql/{}_{:04}_{}.sql", backend.prefix(), m.version, m.name)
}

/// A statement's words: its normal form with parentheses and commas apart.
fn words(normal: &str) -> Vec<String> {
    let spaced: String =
        normal.chars().flat_map(|c| if matches!(c, '(' | ')' | ',') { vec![' ', c, ' '] } else { vec![c] }).collect();
    spaced.split_whitespace().map(str::to_string).collect()
}

fn has(words: &[String], seq: &[&str]) -> bool {
    words.windows(seq.len()).any(|w| w.iter().zip(seq).all(|(a, b)| a == b))
}

/// `words` from `at` on, past each of `optional` that is there, in order.
fn skip(words: &[String], mut at: usize, optional: &[&[&str]]) -> usize {
    for seq in optional {
        if words.len() >= at + seq.len() && words[at..at + seq.len()].iter().zip(*seq).all(|(a, b)| a == b) {
            at += seq.len();
        }
    }
    at
}

/// `CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] [name] ON [ONLY] table`.
struct IndexBuild {
    name: Option<String>,
    table: String,
    unique: bool,
    concurrently: bool,
    if_not_exists: bool,
}

fn index_build(w: &[String]) -> Option<IndexBuild> {
    if w.first().map(String::as_str) != Some("create") {
        return None;
    }
    let unique = w.get(1).map(String::as_str) == Some("unique");
    let at = if unique { 2 } else { 1 };
    if w.get(at).map(String::as_str) != Some("index") {
        return None;
    }
    let concurrently = w.get(at + 1).map(String::as_str) == Some("concurrently");
    let at = skip(w, at + 1, &[&["concurrently"]]);
    let if_not_exists = has(&w[at..], &["if", "not", "exists"]) && w.get(at).map(String::as_str) == Some("if");
    let at = skip(w, at, &[&["if", "not", "exists"]]);
    let (name, at) = match w.get(at).map(String::as_str) {
        Some("on") => (None, at),
        Some(name) => (Some(name.to_string()), at + 1),
        None => return None,
    };
    let at = skip(w, at, &[&["on"], &["only"]]);
    let table = w.get(at)?.clone();
    Some(IndexBuild { name, table, unique, concurrently, if_not_exists })
}

/// `DROP INDEX [CONCURRENTLY] [IF EXISTS] name`: the name.
fn index_drop(w: &[String], from: usize) -> Option<&str> {
    if w.get(from).map(String::as_str) != Some("drop") || w.get(from + 1).map(String::as_str) != Some("index") {
        return None;
    }
    let at = skip(w, from + 2, &[&["concurrently"], &["if", "exists"]]);
    w.get(at).map(String::as_str)
}

/// `CREATE TABLE [IF NOT EXISTS] name`: the name.
fn table_created(w: &[String]) -> Option<&str> {
    if w.first().map(String::as_str) != Some("create") {
        return None;
    }
    let at = skip(w, 1, &[&["unlogged"], &["table"]]);
    if at < 2 || w[at - 1] != "table" {
        return None;
    }
    let at = skip(w, at, &[&["if", "not", "exists"]]);
    w.get(at).map(String::as_str)
}

/// What an expand migration must not do, found in one statement; `rebuilt`: the
/// indexes the migration builds.
fn contract_steps(w: &[String], rebuilt: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, word) in w.iter().enumerate() {
        if word == "drop" {
            match index_drop(w, i) {
                Some(name) if rebuilt.iter().any(|r| r == name) => {}
                Some(name) => found.push(format!("drops index {name} without building it again")),
                None => found.push(format!("drops ({})", w[i..].iter().take(3).cloned().collect::<Vec<_>>().join(" "))),
            }
        }
    }
    if w.iter().any(|x| x == "rename") {
        found.push("renames".into());
    }
    if w.iter().any(|x| x == "truncate") {
        found.push("truncates a table".into());
    }
    if has(w, &["set", "not", "null"]) {
        found.push("sets NOT NULL on a column".into());
    }
    if index_build(w).is_some_and(|b| b.unique) {
        found.push("builds a unique index (rows an older binary writes may break it)".into());
    }
    if w.len() >= 2 && w[0] == "alter" && w[1] == "table" {
        if w.iter().any(|x| x == "type") {
            found.push("changes a column's type".into());
        }
        // The clauses of ALTER TABLE, split at the commas outside parentheses.
        let mut depth = 0i32;
        let mut clauses: Vec<Vec<&str>> = vec![Vec::new()];
        for x in &w[2..] {
            match x.as_str() {
                "(" => depth += 1,
                ")" => depth -= 1,
                "," if depth == 0 => {
                    clauses.push(Vec::new());
                    continue;
                }
                _ => {}
            }
            clauses.last_mut().expect("one clause at least").push(x.as_str());
        }
        for c in clauses.iter().filter(|c| c.contains(&"add")) {
            let add = c.iter().position(|x| *x == "add").expect("an add");
            if c.get(add + 1) == Some(&"constraint")
                || c.iter().any(|x| matches!(*x, "check" | "unique" | "primary" | "foreign"))
            {
                found.push("adds a constraint (rows an older binary writes may break it)".into());
            } else if c.windows(2).any(|p| p == ["not", "null"]) && !c.contains(&"default") {
                found.push("adds a NOT NULL column without a default (an older binary's inserts leave it out)".into());
            }
        }
    }
    found
}

/// The findings of `migrations` (one store's list), against `released`.
fn lint(backend: Backend, migrations: &[Migration], released: &[(Backend, i64, &str)]) -> Vec<Finding> {
    let mut findings = Vec::new();
    let released: Vec<(i64, &str)> =
        released.iter().filter(|(b, ..)| *b == backend).map(|&(_, v, sum)| (v, sum)).collect();
    let last_released = released.iter().map(|(v, _)| *v).max().unwrap_or(0);
    for &(version, _) in &released {
        if !migrations.iter().any(|m| m.version == version) {
            findings.push(Finding {
                file: format!("src/inbox/sql/{}_{version:04}_*.sql", backend.prefix()),
                rule: Rule::ReleasedUnchanged,
                message: format!(
                    "released migration {version} is gone from the list: never remove a released migration"
                ),
            });
        }
    }
    for m in migrations {
        let file = file(backend, m);
        let mut find = |rule, message: String| findings.push(Finding { file: file.clone(), rule, message });
        match released.iter().find(|(v, _)| *v == m.version) {
            Some((_, sum)) if *sum != m.checksum() => find(
                Rule::ReleasedUnchanged,
                format!(
                    "never edit a released migration; add a new one (released with sha256 {}, now {})",
                    schema::short(sum),
                    schema::short(&m.checksum())
                ),
            ),
            None if m.version <= last_released => find(
                Rule::ReleasedUnchanged,
                format!("version {} is numbered among the released ones but is not one of them", m.version),
            ),
            _ => {}
        }
        let statements: Vec<(String, Vec<String>)> =
            sql_text::statements(m.sql).into_iter().map(|s| (s.text.to_string(), words(&s.normal))).collect();
        let built: Vec<String> = statements.iter().filter_map(|(_, w)| index_build(w)?.name).collect();
        let tables: Vec<&str> = statements.iter().filter_map(|(_, w)| table_created(w)).collect();
        let concurrently = statements.iter().any(|(_, w)| w.iter().any(|x| x == "concurrently"));

        if m.compatible_from < m.version {
            for (text, w) in &statements {
                for what in contract_steps(w, &built) {
                    find(
                        Rule::ExpandOnlyAdds,
                        format!(
                            "migration {} declares compatible_from({}) (expand: binaries of schema {} run on it), \
                             but `{}` {what}: that is a contract step, for a later migration that declares nothing",
                            m.version,
                            m.compatible_from,
                            m.compatible_from,
                            first_line(text)
                        ),
                    );
                }
            }
        }
        if backend == Backend::Sqlite && m.outside_transaction {
            find(
                Rule::SqliteInTransaction,
                "SQLite runs every migration of a run in its one transaction; outside_transaction is PostgreSQL's"
                    .into(),
            );
        }
        if backend == Backend::Postgres && m.version > last_released {
            for (text, w) in &statements {
                let Some(b) = index_build(w) else { continue };
                if tables.contains(&b.table.as_str()) || (b.concurrently && m.outside_transaction) {
                    continue;
                }
                find(
                    Rule::IndexConcurrently,
                    format!(
                        "`{}` builds an index on the existing table {} {}: that blocks the table's writes for the \
                         whole build; use CREATE INDEX CONCURRENTLY in a migration declared .outside_transaction()",
                        first_line(text),
                        b.table,
                        if b.concurrently { "in a transaction" } else { "without CONCURRENTLY" }
                    ),
                );
            }
        }
        if concurrently && !m.outside_transaction {
            find(
                Rule::ConcurrentlyOutsideTransaction,
                "PostgreSQL refuses CONCURRENTLY inside a transaction: declare the migration .outside_transaction()"
                    .into(),
            );
        }
        if m.outside_transaction && backend == Backend::Postgres {
            if !concurrently {
                find(
                    Rule::OutsideTransactionForConcurrently,
                    "runs outside a transaction but does nothing CONCURRENTLY: it gives up all-or-nothing for \
                     nothing; drop .outside_transaction()"
                        .into(),
                );
            }
            for (i, (text, w)) in statements.iter().enumerate() {
                let problem = match index_build(w) {
                    Some(b) if b.concurrently => match &b.name {
                        _ if b.if_not_exists => Some(
                            "keeps the INVALID index a failed build leaves (IF NOT EXISTS): write DROP INDEX \
                             CONCURRENTLY IF EXISTS <name>; then CREATE INDEX CONCURRENTLY <name> …"
                                .to_string(),
                        ),
                        None => Some("builds an unnamed index, which a run after a failure builds twice".into()),
                        Some(name) => {
                            let before = i.checked_sub(1).map(|p| &statements[p].1);
                            let dropped = before.is_some_and(|p| {
                                has(p, &["drop", "index", "concurrently", "if", "exists"])
                                    && index_drop(p, 0) == Some(name.as_str())
                            });
                            (!dropped).then(|| {
                                format!(
                                    "must come right after DROP INDEX CONCURRENTLY IF EXISTS {name}, which removes \
                                     the INVALID index a failed build leaves"
                                )
                            })
                        }
                    },
                    _ if has(w, &["if", "exists"]) || has(w, &["if", "not", "exists"]) => None,
                    _ => Some(
                        "is not idempotent: a run after a failure would fail on what it did; use IF [NOT] EXISTS"
                            .into(),
                    ),
                };
                if let Some(problem) = problem {
                    find(
                        Rule::OutsideTransactionIdempotent,
                        format!(
                            "outside a transaction, each statement completes what an earlier try left; `{}` {problem}",
                            first_line(text)
                        ),
                    );
                }
            }
        }
    }
    findings
}

/// A statement's first line that is not a comment, for a message.
fn first_line(text: &str) -> &str {
    text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("--")).unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(findings: &[Finding]) -> String {
        findings.iter().map(|f| format!("\n  {f}")).collect()
    }

    #[test]
    fn every_embedded_migration_passes_the_lint() {
        for (backend, list) in [
            (Backend::Postgres, super::super::postgres::MIGRATIONS),
            (Backend::Sqlite, super::super::sqlite::MIGRATIONS),
        ] {
            let findings = lint(backend, list, RELEASED);
            assert!(findings.is_empty(), "{backend:?}:{}", report(&findings));
        }
    }

    /// The lint's file names are the files the SQL is embedded from, and every
    /// migration file in `sql/` is embedded (so every one is linted).
    #[test]
    fn every_migration_file_in_sql_is_embedded_under_the_name_the_lint_gives() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut embedded = Vec::new();
        for (backend, list) in [
            (Backend::Postgres, super::super::postgres::MIGRATIONS),
            (Backend::Sqlite, super::super::sqlite::MIGRATIONS),
        ] {
            for m in list {
                let name = file(backend, m);
                let on_disk = std::fs::read_to_string(root.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(on_disk, m.sql, "{name} is what version {} embeds", m.version);
                embedded.push(name);
            }
        }
        for entry in std::fs::read_dir(root.join("src/inbox/sql")).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.starts_with("postgres_") || name.starts_with("sqlite_") {
                let path = format!("src/inbox/sql/{name}");
                assert!(embedded.contains(&path), "{path} is a migration file no list embeds");
            }
        }
    }

    fn pg(version: i64, sql: &'static str) -> Migration {
        Migration::new(version, "probe", sql)
    }

    /// The rules `sql` breaks as migration `m` of PostgreSQL after the released ones.
    fn rules(m: Migration) -> Vec<Rule> {
        let findings = lint(Backend::Postgres, &[m], &[(Backend::Postgres, 9, "")]);
        let mut rules: Vec<Rule> = findings.iter().map(|f| f.rule).collect();
        rules.retain(|r| *r != Rule::ReleasedUnchanged);
        rules
    }

    #[test]
    fn an_edited_released_migration_fails_naming_its_file_and_the_rule() {
        let mut edited: Vec<Migration> = super::super::postgres::MIGRATIONS.to_vec();
        edited[8] = Migration::new(9, "hot_path_indexes", "-- reworded\nDROP INDEX inbox_entry_unresolved_key;");
        let findings = lint(Backend::Postgres, &edited, RELEASED);
        assert_eq!(findings.len(), 1, "{}", report(&findings));
        let said = findings[0].to_string();
        assert!(
            said.starts_with("src/inbox/sql/postgres_0009_hot_path_indexes.sql: rule released-unchanged: "),
            "{said}"
        );
        assert!(said.contains("never edit a released migration; add a new one"), "{said}");

        let findings = lint(Backend::Sqlite, &super::super::sqlite::MIGRATIONS[..7], RELEASED);
        assert_eq!(findings.iter().map(|f| f.rule).collect::<Vec<_>>(), [Rule::ReleasedUnchanged]);
        assert!(findings[0].message.contains("released migration 8 is gone"), "{}", report(&findings));
    }

    #[test]
    fn an_expand_migration_may_only_add() {
        for bad in [
            "ALTER TABLE inbox_entry DROP COLUMN not_yet_since",
            "DROP TABLE inbox_audit",
            "ALTER TABLE inbox_entry DROP CONSTRAINT inbox_entry_status",
            "DROP INDEX inbox_entry_finished",
            "ALTER TABLE inbox_entry RENAME COLUMN body TO payload",
            "ALTER TABLE inbox_entry ALTER COLUMN attempts TYPE BIGINT",
            "ALTER TABLE inbox_entry ALTER COLUMN event_type SET NOT NULL",
            "ALTER TABLE inbox_entry ADD COLUMN tenant TEXT NOT NULL",
            "ALTER TABLE inbox_entry ADD COLUMN a TEXT, ADD COLUMN tenant TEXT NOT NULL",
            "ALTER TABLE inbox_entry ADD CONSTRAINT inbox_entry_positive CHECK (attempts >= 0)",
            "CREATE UNIQUE INDEX inbox_entry_message ON inbox_entry (message_id)",
            "TRUNCATE inbox_audit",
        ] {
            let m = pg(10, Box::leak(format!("-- expand?\n{bad};").into_boxed_str())).compatible_from(9);
            let findings = lint(Backend::Postgres, &[m], &[]);
            assert!(findings.iter().any(|f| f.rule == Rule::ExpandOnlyAdds), "not refused: {bad}{}", report(&findings));
            let said = findings.iter().find(|f| f.rule == Rule::ExpandOnlyAdds).unwrap().to_string();
            assert!(said.starts_with("src/inbox/sql/postgres_0010_probe.sql: rule expand-only-adds: "), "{said}");
        }
        // Adding, a NOT NULL column with a default, an index built again, and words
        // inside comments and literals are all fine.
        let adds = pg(
            10,
            "CREATE TABLE extra (id BIGINT PRIMARY KEY, note TEXT NOT NULL);\n\
             ALTER TABLE inbox_entry ADD COLUMN tenant TEXT, ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;\n\
             /* DROP TABLE inbox_entry; */ -- RENAME later\n\
             UPDATE inbox_entry SET tenant = 'DROP TABLE x; SET NOT NULL';\n\
             DROP INDEX inbox_entry_finished;\n\
             CREATE INDEX inbox_entry_finished ON inbox_entry (finished_at) WHERE status = 'DONE';",
        )
        .compatible_from(9);
        let findings = lint(Backend::Postgres, &[adds], &[]);
        assert!(findings.iter().all(|f| f.rule != Rule::ExpandOnlyAdds), "{}", report(&findings));
        // The same steps are fine in a contract migration (it declares nothing).
        let contract = pg(10, "ALTER TABLE inbox_entry DROP COLUMN not_yet_since; DROP TABLE inbox_audit;");
        assert_eq!(rules(contract), []);
    }

    #[test]
    fn a_new_index_on_an_existing_table_is_built_concurrently_outside_a_transaction() {
        let plain = pg(10, "CREATE INDEX inbox_entry_received ON inbox_entry (received_at);");
        assert_eq!(rules(plain), [Rule::IndexConcurrently]);
        let said = lint(Backend::Postgres, &[plain], &[(Backend::Postgres, 9, "")])
            .into_iter()
            .find(|f| f.rule == Rule::IndexConcurrently)
            .unwrap()
            .to_string();
        assert!(said.starts_with("src/inbox/sql/postgres_0010_probe.sql: rule index-concurrently: "), "{said}");
        assert!(said.contains("existing table inbox_entry without CONCURRENTLY"), "{said}");

        let in_transaction = pg(10, "CREATE INDEX CONCURRENTLY x ON ONLY inbox_entry (received_at);");
        assert_eq!(rules(in_transaction), [Rule::IndexConcurrently, Rule::ConcurrentlyOutsideTransaction]);

        // A table of the migration's own is empty: a plain index on it is fine, and so
        // are the released migrations' plain builds.
        let own = pg(10, "CREATE TABLE extra (id BIGINT); CREATE INDEX extra_id ON extra (id);");
        assert_eq!(rules(own), []);
        let released = pg(7, "CREATE INDEX inbox_entry_received ON inbox_entry (received_at);");
        assert_eq!(rules(released), []);

        let good = pg(
            10,
            "-- Built while the inbox takes writes.\n\
             DROP INDEX CONCURRENTLY IF EXISTS inbox_entry_received;\n\
             CREATE INDEX CONCURRENTLY inbox_entry_received ON inbox_entry (received_at);",
        )
        .outside_transaction()
        .compatible_from(9);
        assert_eq!(rules(good), []);
    }

    #[test]
    fn a_migration_outside_a_transaction_holds_only_statements_a_rerun_completes() {
        let cases: [(&str, &[Rule]); 6] = [
            (
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON inbox_entry (received_at);",
                &[Rule::OutsideTransactionIdempotent],
            ),
            ("CREATE INDEX CONCURRENTLY x ON inbox_entry (received_at);", &[Rule::OutsideTransactionIdempotent]),
            (
                "DROP INDEX CONCURRENTLY IF EXISTS y; CREATE INDEX CONCURRENTLY x ON inbox_entry (received_at);",
                &[Rule::OutsideTransactionIdempotent],
            ),
            ("CREATE INDEX CONCURRENTLY ON inbox_entry (received_at);", &[Rule::OutsideTransactionIdempotent]),
            (
                "DROP INDEX CONCURRENTLY IF EXISTS x; CREATE INDEX CONCURRENTLY x ON inbox_entry (received_at);\n\
                 ALTER TABLE inbox_entry ADD COLUMN tenant TEXT;",
                &[Rule::OutsideTransactionIdempotent],
            ),
            ("CREATE TABLE IF NOT EXISTS extra (id BIGINT);", &[Rule::OutsideTransactionForConcurrently]),
        ];
        for (sql, expected) in cases {
            let m = pg(10, sql).outside_transaction();
            assert_eq!(rules(m), expected, "{sql}");
        }
        let said = lint(Backend::Postgres, &[pg(10, cases[0].0).outside_transaction()], &[]).remove(0).to_string();
        assert!(
            said.starts_with("src/inbox/sql/postgres_0010_probe.sql: rule outside-transaction-idempotent: "),
            "{said}"
        );
        assert!(said.contains("keeps the INVALID index a failed build leaves"), "{said}");
    }

    #[test]
    fn sqlite_migrations_all_run_in_a_transaction() {
        let m = Migration::new(9, "probe", "CREATE INDEX IF NOT EXISTS x ON inbox_entry (received_at);")
            .outside_transaction();
        let findings = lint(Backend::Sqlite, &[m], &[]);
        assert_eq!(
            findings.iter().map(|f| f.rule).collect::<Vec<_>>(),
            [Rule::SqliteInTransaction],
            "{}",
            report(&findings)
        );
        assert!(
            findings[0].to_string().starts_with("src/inbox/sql/sqlite_0009_probe.sql: rule sqlite-in-transaction: ")
        );
    }
}
