//! SQL as text, for the migrations: a script split into its statements (a migration
//! that runs outside a transaction sends them one at a time, because PostgreSQL runs a
//! multi-statement query as one implicit transaction), and each statement's normal
//! form (comments dropped, string literals emptied, lowercase, single spaces) that the
//! migration lint matches words in.

/// One statement of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement<'a> {
    /// As written, without the `;` that ends it (comments kept).
    pub text: &'a str,
    /// Comments dropped, each string literal and dollar-quoted body emptied (`''`,
    /// `$$`), quoted identifiers kept, everything else lowercase, runs of whitespace one
    /// space: `drop index concurrently if exists "x"`.
    pub normal: String,
}

/// The statements of `sql`, split at the semicolons outside comments, literals, quoted
/// identifiers and dollar quotes; a piece holding only comments and whitespace is no
/// statement.
pub fn statements(sql: &str) -> Vec<Statement<'_>> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    let mut normal = String::new();
    let push = |normal: &mut String, s: &str| {
        for c in s.chars() {
            if c.is_whitespace() {
                if !normal.is_empty() && !normal.ends_with(' ') {
                    normal.push(' ');
                }
            } else {
                normal.extend(c.to_lowercase());
            }
        }
    };
    while i < bytes.len() {
        let rest = &sql[i..];
        if rest.starts_with("--") {
            let end = rest.find('\n').map_or(sql.len(), |n| i + n);
            push(&mut normal, " ");
            i = end;
        } else if rest.starts_with("/*") {
            // PostgreSQL's block comments nest.
            let mut depth = 0usize;
            let mut j = i;
            while j < bytes.len() {
                if sql[j..].starts_with("/*") {
                    depth += 1;
                    j += 2;
                } else if sql[j..].starts_with("*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            push(&mut normal, " ");
            i = j;
        } else if bytes[i] == b'\'' {
            // '' inside a literal is a quote, not its end.
            let mut j = i + 1;
            while j < bytes.len() {
                if bytes[j] == b'\'' {
                    if bytes.get(j + 1) == Some(&b'\'') {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            normal.push_str("''");
            i = (j + 1).min(bytes.len());
        } else if bytes[i] == b'"' {
            let end = sql[i + 1..].find('"').map_or(sql.len(), |n| i + 1 + n + 1);
            normal.push_str(&sql[i..end]);
            i = end;
        } else if let Some(tag) = dollar_tag(rest) {
            let body_end = rest[tag.len()..].find(tag).map_or(sql.len(), |n| i + tag.len() + n + tag.len());
            normal.push_str("$$");
            i = body_end;
        } else if bytes[i] == b';' {
            finish(&mut out, &sql[start..i], &mut normal);
            i += 1;
            start = i;
        } else {
            let c = rest.chars().next().expect("not at the end");
            push(&mut normal, &rest[..c.len_utf8()]);
            i += c.len_utf8();
        }
    }
    finish(&mut out, &sql[start..], &mut normal);
    out
}

fn finish<'a>(out: &mut Vec<Statement<'a>>, text: &'a str, normal: &mut String) {
    let n = normal.trim().to_string();
    normal.clear();
    if !n.is_empty() {
        out.push(Statement { text: text.trim(), normal: n });
    }
}

/// The opening tag of a dollar quote at the start of `s` (`$$`, `$body$`).
fn dollar_tag(s: &str) -> Option<&str> {
    let rest = s.strip_prefix('$')?;
    let end = rest.find('$')?;
    let tag = &rest[..end];
    let plain = tag.chars().enumerate().all(|(n, c)| c == '_' || c.is_alphabetic() || (n > 0 && c.is_ascii_digit()));
    plain.then(|| &s[..end + 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normals(sql: &str) -> Vec<String> {
        statements(sql).into_iter().map(|s| s.normal).collect()
    }

    #[test]
    fn splits_at_semicolons_outside_comments_literals_and_dollar_quotes() {
        let sql = "-- a comment; with a semicolon\nDROP INDEX CONCURRENTLY IF EXISTS x;\n\
                   /* block /* nested; */ still */ CREATE INDEX CONCURRENTLY x ON t (a) WHERE b = 'it''s; DROP TABLE t';\n\
                   DO $body$ BEGIN PERFORM 1; END $body$;\n-- trailing comment only\n";
        assert_eq!(
            normals(sql),
            ["drop index concurrently if exists x", "create index concurrently x on t (a) where b = ''", "do $$",]
        );
        let texts: Vec<&str> = statements(sql).into_iter().map(|s| s.text).collect();
        assert_eq!(texts[0], "-- a comment; with a semicolon\nDROP INDEX CONCURRENTLY IF EXISTS x");
        assert!(texts[1].ends_with("WHERE b = 'it''s; DROP TABLE t'"), "{}", texts[1]);
        assert_eq!(texts[2], "DO $body$ BEGIN PERFORM 1; END $body$");
    }

    #[test]
    fn keeps_quoted_identifiers_and_folds_the_rest() {
        assert_eq!(normals("Create  Index \"Odd;Name\"\n  ON t(a)"), ["create index \"Odd;Name\" on t(a)"]);
        assert!(normals("  -- nothing\n /* at all */ ").is_empty());
    }
}
