//! Configuration errors: each names the file, line, column and field.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error concerns the whole file.
    pub line: usize,
    /// 1-based; 0 when the error concerns the whole file.
    pub column: usize,
    /// Dotted path of the field, e.g. `route[1].target.timeout`; empty when unknown.
    pub field: String,
    pub kind: ConfigErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigErrorKind {
    #[error("cannot read the routing file or directory: {0}")]
    Read(String),
    #[error("{0}")]
    Parse(String),
    #[error("environment variable `{0}` is not set")]
    UnknownEnvVar(String),
    #[error(
        "`${{{name}}}`: environment variable `{name}` is not granted to this team file; the shared routing file grants it with `[[grant]] file = \"{file}\"  env = [\"{name}\"]`"
    )]
    NotGranted { name: String, file: String },
    #[error("unterminated `${{` in value")]
    UnterminatedEnvRef,
    #[error("plugin file `{path}` does not exist")]
    MissingPluginFile { path: String },
    #[error("route name `{name}` is already used at line {first_line}")]
    DuplicateRoute { name: String, first_line: usize },
    #[error("route name `{name}` is already used at {first_file}:{first_line}")]
    DuplicateRouteAcrossFiles { name: String, first_file: String, first_line: usize },
    #[error(
        "`[{table}]` is already declared at {first_file}:{first_line}: the shared settings belong in one routing file"
    )]
    SharedSettingsTwice { table: &'static str, first_file: String, first_line: usize },
    #[error("no routing file here declares `[store]`: put the shared `[store]` (and `[server]`) in one of them")]
    NoStore,
    #[error("`{field}` is required for {kind}")]
    MissingField { field: &'static str, kind: &'static str },
    #[error("`{field}` does not apply to {kind}")]
    FieldNotAllowed { field: String, kind: &'static str },
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    pub(super) fn whole_file(file: &Path, kind: ConfigErrorKind) -> Self {
        ConfigError { file: file.to_path_buf(), line: 0, column: 0, field: String::new(), kind }
    }

    pub(super) fn at(
        file: &Path,
        text: &str,
        span: Range<usize>,
        field: impl Into<String>,
        kind: ConfigErrorKind,
    ) -> Self {
        let (line, column) = line_col(text, span.start);
        ConfigError { file: file.to_path_buf(), line, column, field: field.into(), kind }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// Every error found in the routing files, file by file, each file's in line order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub(super) fn single(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
