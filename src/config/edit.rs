//! `inlet plugin promote` and `rollback` as text edits of a routing file.
//!
//! A routing file is written and reviewed by people, so these commands change only
//! the lines they must: the route's `plugin`, `candidate` and `previous` values.
//! Comments, other routes, blank lines, key order and alignment stay byte for byte,
//! and the diff a reviewer sees is the promotion and nothing else.
//!
//! Positions come from toml's spans, but a span alone does not say how a key is
//! written (`plugin.path = …` and `[route.plugin]` have spans too, pointing at a key
//! or a header). So each key is rewritten only in the one shape whose text we can
//! replace without guessing, `key = value  # comment` alone on its line; any other
//! shape is refused with the lines to write by hand. The result is parsed again and
//! compared with the intended data before it is returned, so a mistake here is an
//! error, never a broken routing file.

use std::ops::Range;

use serde::Deserialize;
use toml::{Spanned, Table, Value};

/// What to do to a route's plugin versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The candidate becomes the plugin; the old plugin is kept as `previous`.
    Promote,
    /// Exact undo of a promotion: `previous` becomes the plugin; the plugin it
    /// replaces is the candidate again.
    Rollback,
}

/// Why a routing file was not edited. Each says what to change in the file (or to
/// do by hand), since the person running the command is the one who can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("the routing file is not valid TOML: {message}")]
    InvalidToml { message: String },
    #[error("the routing file's [[route]] tables cannot be read: {message}")]
    UnreadableRoutes { message: String },
    #[error("route `{route}` is not declared in this file")]
    RouteNotFound { route: String },
    #[error("route `{route}` is declared {count} times in this file; give each route its own name first")]
    DuplicateRoute { route: String, count: usize },
    #[error("route `{route}` has no `plugin`; write `plugin = \"path/to/plugin.wasm\"` in its [[route]] table")]
    NoPlugin { route: String },
    #[error(
        "route `{route}` has no candidate to promote; write the new version in its [[route]] table first: \
         `candidate = \"path/to/new.wasm\"` or `candidate = {{ path = \"path/to/new.wasm\", sha256 = \"<64 hex digits>\" }}`"
    )]
    NoCandidate { route: String },
    #[error(
        "route `{route}` has no `previous` to roll back to (a promotion writes it); to serve another version, \
         write it as `plugin = \"path/to/old.wasm\"` in its [[route]] table"
    )]
    NoPrevious { route: String },
    #[error(
        "route `{route}`: `{key}` is written {form}, which this edit cannot rewrite safely; \
         make the change by hand, so that the route reads:\n{intended}"
    )]
    ManualEdit { route: String, key: &'static str, form: String, intended: String },
    #[error("the edit of route `{route}` did not check out ({detail}); the routing file was not changed")]
    SelfCheck { route: String, detail: String },
}

/// Applies `step` to route `route` of the routing file `text` and returns the new text.
///
/// Pure: the caller reads and writes the file, so it can show the change first or
/// write it atomically, and nothing is written when this returns an error.
pub fn apply(text: &str, route: &str, step: Step) -> Result<String, EditError> {
    let document = parse_document(text)?;
    let (index, spans) = find_route(text, route)?;
    let plan = Plan::new(route, step, &spans)?;
    let edits = plan.edits(text)?;
    let edited = splice(text, edits).map_err(|detail| self_check_error(route, detail))?;
    plan.check(&document, index, &edited)?;
    Ok(edited)
}

/// The three keys a promotion or rollback moves values between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Plugin,
    Candidate,
    Previous,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Plugin => "plugin",
            Key::Candidate => "candidate",
            Key::Previous => "previous",
        }
    }
}

impl Step {
    /// The key whose value becomes the plugin, and the key that keeps the old plugin.
    /// Rollback is promotion with the two swapped, which is what makes it an undo.
    fn keys(self) -> (Key, Key) {
        match self {
            Step::Promote => (Key::Candidate, Key::Previous),
            Step::Rollback => (Key::Previous, Key::Candidate),
        }
    }
}

/// Only where things are: the rest of a route is ignored.
#[derive(Deserialize)]
struct FileSpans {
    #[serde(default)]
    route: Vec<Spanned<RouteSpans>>,
}

#[derive(Deserialize)]
struct RouteSpans {
    name: Spanned<String>,
    plugin: Option<Spanned<Value>>,
    candidate: Option<Spanned<Value>>,
    previous: Option<Spanned<Value>>,
}

impl RouteSpans {
    fn get(&self, key: Key) -> Option<&Spanned<Value>> {
        match key {
            Key::Plugin => self.plugin.as_ref(),
            Key::Candidate => self.candidate.as_ref(),
            Key::Previous => self.previous.as_ref(),
        }
    }
}

/// The whole file as data: the self-check compares the edited file against it.
fn parse_document(text: &str) -> Result<Table, EditError> {
    toml::from_str::<Table>(text).map_err(|e| EditError::InvalidToml { message: located(text, &e) })
}

/// The route named `route`, with its position among the file's routes (the same
/// index as in the parsed document's `route` array).
fn find_route(text: &str, route: &str) -> Result<(usize, Spanned<RouteSpans>), EditError> {
    let file =
        toml::from_str::<FileSpans>(text).map_err(|e| EditError::UnreadableRoutes { message: located(text, &e) })?;
    let count = file.route.iter().filter(|r| r.get_ref().name.get_ref() == route).count();
    if count > 1 {
        return Err(EditError::DuplicateRoute { route: route.to_string(), count });
    }
    file.route
        .into_iter()
        .enumerate()
        .find(|(_, r)| r.get_ref().name.get_ref() == route)
        .ok_or_else(|| EditError::RouteNotFound { route: route.to_string() })
}

/// A toml error as one line, with where it is: toml's own rendering is a multi-line
/// snippet meant for a terminal, not for an error that others wrap.
fn located(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_string(),
    }
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// The values a step moves, and the route they belong to.
struct Plan<'a> {
    route: &'a str,
    spans: &'a Spanned<RouteSpans>,
    /// The key whose value becomes the plugin (`candidate` to promote).
    incoming: Key,
    /// The key that keeps the old plugin (`previous` to promote).
    stash: Key,
}

impl<'a> Plan<'a> {
    fn new(route: &'a str, step: Step, spans: &'a Spanned<RouteSpans>) -> Result<Self, EditError> {
        let (incoming, stash) = step.keys();
        let plan = Plan { route, spans, incoming, stash };
        if plan.value(incoming).is_none() {
            let route = route.to_string();
            return Err(match step {
                Step::Promote => EditError::NoCandidate { route },
                Step::Rollback => EditError::NoPrevious { route },
            });
        }
        if plan.value(Key::Plugin).is_none() {
            return Err(EditError::NoPlugin { route: route.to_string() });
        }
        Ok(plan)
    }

    fn value(&self, key: Key) -> Option<&'a Spanned<Value>> {
        self.spans.get_ref().get(key)
    }

    /// Text edits of the original: the plugin takes the incoming value, the stash key
    /// takes the old plugin (replaced in place, or a new line after `plugin`), and the
    /// incoming key's line goes.
    fn edits(&self, text: &str) -> Result<Vec<Edit>, EditError> {
        let plugin = self.line(text, Key::Plugin)?;
        let incoming = self.line(text, self.incoming)?;
        let stash = match self.value(self.stash) {
            Some(_) => Some(self.line(text, self.stash)?),
            None => None,
        };
        let old_plugin = &text[plugin.value.clone()];
        let mut edits = vec![Edit::replace(plugin.value.clone(), &text[incoming.value.clone()])];
        match stash {
            Some(stash) => {
                edits.push(Edit::replace(stash.value, old_plugin));
                edits.push(Edit::replace(incoming.whole, ""));
            }
            None => edits.extend(Self::swap_line(&plugin, &incoming, self.stash.name(), old_plugin)),
        }
        Ok(edits)
    }

    /// Removes the incoming key's line and writes `key = value` right after the
    /// plugin's. When the removed line is the one right after the plugin's, the new
    /// line takes its place and keeps its ending, so a file whose last line has no
    /// line ending still has none after a promotion and a rollback.
    fn swap_line(plugin: &KeyLine<'_>, incoming: &KeyLine<'_>, key: &str, value: &str) -> Vec<Edit> {
        let line = plugin.sibling(key, value);
        if incoming.whole.start == plugin.whole.end {
            return vec![Edit::replace(incoming.content(), &line)];
        }
        // The plugin's line may be the file's last and have no ending to copy.
        let inserted = match plugin.ending {
            "" => format!("\n{line}"),
            ending => format!("{line}{ending}"),
        };
        vec![Edit::insert(plugin.whole.end, inserted), Edit::replace(incoming.whole.clone(), "")]
    }

    /// Where `key` is written, or why it cannot be rewritten.
    fn line<'t>(&self, text: &'t str, key: Key) -> Result<KeyLine<'t>, EditError> {
        let value = self.value(key).expect("the plan checked which keys are present");
        let written = if text[self.spans.span()].starts_with("[[") {
            KeyLine::find(text, key.name(), value)
        } else {
            Err("in an inline route table (`route = [ { … } ]`)".to_string())
        };
        written.map_err(|form| self.manual_edit(key, form))
    }

    /// The refusal for a key in a shape this edit does not rewrite, with the
    /// intended values so the change can be made by hand.
    fn manual_edit(&self, key: Key, form: String) -> EditError {
        let plugin = self.value(Key::Plugin).map(|v| v.get_ref());
        let incoming = self.value(self.incoming).map(|v| v.get_ref());
        let mut intended = String::new();
        for (k, v) in [(Key::Plugin, incoming), (self.stash, plugin)] {
            if let Some(v) = v {
                intended.push_str(&format!("    {} = {v}\n", k.name()));
            }
        }
        intended.push_str(&format!("and no `{}`", self.incoming.name()));
        EditError::ManualEdit { route: self.route.to_string(), key: key.name(), form, intended }
    }

    /// Parses the edited text and compares it with the original data changed only as
    /// intended: the route's three keys, nothing else anywhere in the file.
    fn check(&self, original: &Table, index: usize, edited: &str) -> Result<(), EditError> {
        let expected = self
            .expected(original, index)
            .ok_or_else(|| self_check_error(self.route, "the route is not where toml first read it".to_string()))?;
        let actual = toml::from_str::<Table>(edited)
            .map_err(|e| self_check_error(self.route, format!("the result does not parse: {}", located(edited, &e))))?;
        if actual != expected {
            return Err(self_check_error(self.route, "the result reads differently from the intended change".into()));
        }
        Ok(())
    }

    /// The original document with the step applied to the data.
    fn expected(&self, original: &Table, index: usize) -> Option<Table> {
        let mut expected = original.clone();
        let route = expected.get_mut("route")?.as_array_mut()?.get_mut(index)?.as_table_mut()?;
        let old_plugin = route.get(Key::Plugin.name())?.clone();
        let incoming = route.remove(self.incoming.name())?;
        route.insert(Key::Plugin.name().to_string(), incoming);
        route.insert(self.stash.name().to_string(), old_plugin);
        Some(expected)
    }
}

fn self_check_error(route: &str, detail: String) -> EditError {
    EditError::SelfCheck { route: route.to_string(), detail }
}

/// A key written as `key = value` alone on its line (an end-of-line comment allowed).
#[derive(Debug)]
struct KeyLine<'t> {
    /// The value's text, exactly as written.
    value: Range<usize>,
    /// The whole line with its line ending: what removing the key removes.
    whole: Range<usize>,
    /// The line's layout, copied by a new line written after it.
    indent: &'t str,
    key_width: usize,
    before_eq: &'t str,
    after_eq: &'t str,
    ending: &'t str,
}

impl<'t> KeyLine<'t> {
    /// Finds how `key` is written from its value's span, or says (as a phrase after
    /// "written") what makes the shape unsafe to rewrite.
    fn find(text: &'t str, key: &str, value: &Spanned<Value>) -> Result<Self, String> {
        let span = value.span();
        let value_text = &text[span.clone()];
        let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
        let Some(prefix) = Prefix::parse(&text[start..span.start], key) else {
            return Err(Self::odd_shape(text, key, span));
        };
        if value_text.contains('\n') {
            return Err("over several lines".to_string());
        }
        let (content_end, end) = line_end(text, span.end);
        if !is_trailer(&text[span.end..content_end]) || !reads_as(value_text, value.get_ref()) {
            return Err(format!("other than as `{key} = …` alone on its line"));
        }
        Ok(KeyLine {
            value: span,
            whole: start..end,
            indent: prefix.indent,
            key_width: prefix.key_width,
            before_eq: prefix.before_eq,
            after_eq: prefix.after_eq,
            ending: &text[content_end..end],
        })
    }

    /// The reason for a value span with no `key =` before it: toml gives a table
    /// declared by a header the header's span, and one made by dotted keys the span
    /// of its first key.
    fn odd_shape(text: &str, key: &str, span: Range<usize>) -> String {
        if text[span.clone()].starts_with('[') {
            format!("as a sub-table (`[route.{key}]`)")
        } else if text[span.end..].trim_start_matches([' ', '\t']).starts_with('.') {
            format!("with dotted keys (`{key}.path = …`)")
        } else {
            format!("other than as `{key} = …` alone on its line")
        }
    }

    /// A line for `key` in this line's layout (without a line ending), to go right
    /// after it. The `=` lines up with this line's where the new key is short enough,
    /// so aligned files stay aligned (and a rollback writes back the line a promotion
    /// removed).
    fn sibling(&self, key: &str, value: &str) -> String {
        let before_eq = if self.before_eq.bytes().all(|b| b == b' ') {
            let aligned = (self.key_width + self.before_eq.len()).saturating_sub(key.len());
            " ".repeat(aligned.max(self.before_eq.len().min(1)))
        } else {
            self.before_eq.to_string()
        };
        format!("{}{key}{before_eq}={}{value}", self.indent, self.after_eq)
    }

    /// The line without its line ending.
    fn content(&self) -> Range<usize> {
        self.whole.start..self.whole.end - self.ending.len()
    }
}

/// The text on a line before a value: `indent key before_eq = after_eq`.
struct Prefix<'t> {
    indent: &'t str,
    key_width: usize,
    before_eq: &'t str,
    after_eq: &'t str,
}

impl<'t> Prefix<'t> {
    fn parse(prefix: &'t str, key: &str) -> Option<Self> {
        let body = prefix.trim_start_matches([' ', '\t']);
        let indent = &prefix[..prefix.len() - body.len()];
        let key_width = key_width(body, key)?;
        let rest = &body[key_width..];
        let at_eq = rest.trim_start_matches([' ', '\t']);
        let before_eq = &rest[..rest.len() - at_eq.len()];
        let after_eq = at_eq.strip_prefix('=')?;
        after_eq.bytes().all(|b| b == b' ' || b == b'\t').then_some(Prefix { indent, key_width, before_eq, after_eq })
    }
}

/// Length of `key` at the start of `s`, written bare or quoted without escapes; `None`
/// when `s` starts with any other key. Escaped spellings are refused rather than decoded.
fn key_width(s: &str, key: &str) -> Option<usize> {
    let bare = s.len() - s.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-').len();
    if bare > 0 {
        return (&s[..bare] == key).then_some(bare);
    }
    let quote = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let inner = &s[1..];
    let close = inner.find(quote)?;
    (&inner[..close] == key).then_some(close + 2)
}

/// The end of the line holding `offset`: where its content ends (before `\r\n` or
/// `\n`) and where the next line starts.
fn line_end(text: &str, offset: usize) -> (usize, usize) {
    match text[offset..].find('\n') {
        Some(i) => {
            let newline = offset + i;
            let content_end = if text[..newline].ends_with('\r') { newline - 1 } else { newline };
            (content_end, newline + 1)
        }
        None => (text.len(), text.len()),
    }
}

/// Whether what follows a value on its line is only blanks and perhaps a comment.
fn is_trailer(rest: &str) -> bool {
    let rest = rest.trim_start_matches([' ', '\t']);
    rest.is_empty() || rest.starts_with('#')
}

/// Whether `text` on its own parses to `value`: proof that the span is the whole
/// value and not, say, the quoted first part of a dotted key.
fn reads_as(text: &str, value: &Value) -> bool {
    toml::from_str::<Table>(&format!("v = {text}\n")).is_ok_and(|t| t.get("v") == Some(value))
}

/// One change to the original text: `range` becomes `text`.
#[derive(Debug)]
struct Edit {
    range: Range<usize>,
    text: String,
}

impl Edit {
    fn replace(range: Range<usize>, text: &str) -> Self {
        Edit { range, text: text.to_string() }
    }

    fn insert(at: usize, text: String) -> Self {
        Edit { range: at..at, text }
    }
}

/// Applies edits that do not overlap; an insertion sorts before a removal that starts
/// at the same place, so a new line after `plugin` survives the removal of the line
/// that followed it.
fn splice(text: &str, mut edits: Vec<Edit>) -> Result<String, String> {
    edits.sort_by_key(|e| (e.range.start, e.range.end));
    let mut out = String::with_capacity(text.len() + 128);
    let mut done = 0;
    for edit in edits {
        if edit.range.start < done {
            return Err(format!("two changes overlap at byte {}", edit.range.start));
        }
        out.push_str(&text[done..edit.range.start]);
        out.push_str(&edit.text);
        done = edit.range.end;
    }
    out.push_str(&text[done..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn promote(text: &str) -> String {
        apply(text, "orders", Step::Promote).unwrap_or_else(|e| panic!("promote failed: {e}"))
    }

    fn rollback(text: &str) -> String {
        apply(text, "orders", Step::Rollback).unwrap_or_else(|e| panic!("rollback failed: {e}"))
    }

    fn route(body: &str) -> String {
        format!("[[route]]\nname = \"orders\"\n{body}source = {{ kind = \"push\" }}\n")
    }

    #[test]
    fn promote_string_form() {
        let text = route("plugin = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n");
        assert_eq!(promote(&text), route("plugin = \"v2.wasm\"\nprevious = \"v1.wasm\"\n"));
    }

    #[test]
    fn promote_table_form_moves_the_whole_inline_table() {
        let cand = format!("{{ path = \"v2.wasm\", sha256 = \"{PIN}\" }}");
        let text = route(&format!("plugin = {{ path = \"v1.wasm\", sha256 = \"{PIN}\" }}\ncandidate = {cand}\n"));
        let expected = route(&format!("plugin = {cand}\nprevious = {{ path = \"v1.wasm\", sha256 = \"{PIN}\" }}\n"));
        assert_eq!(promote(&text), expected);
    }

    #[test]
    fn promote_mixes_string_and_table_forms() {
        let cand = format!("{{path=\"v2.wasm\",sha256=\"{PIN}\"}}");
        let text = route(&format!("plugin = 'v1.wasm'\ncandidate = {cand}\n"));
        assert_eq!(promote(&text), route(&format!("plugin = {cand}\nprevious = 'v1.wasm'\n")));
    }

    #[test]
    fn promote_replaces_an_existing_previous_in_place() {
        let text = route("previous = \"v0.wasm\"   # kept\nplugin = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n");
        assert_eq!(promote(&text), route("previous = \"v1.wasm\"   # kept\nplugin = \"v2.wasm\"\n"));
    }

    #[test]
    fn rollback_after_promote_is_the_original_text() {
        let originals = [
            route("plugin = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n"),
            route(&format!("plugin = \"v1.wasm\"\ncandidate = {{ path = \"v2.wasm\", sha256 = \"{PIN}\" }}\n")),
            // Aligned keys stay aligned both ways.
            "[[route]]\nname      = \"orders\"\nplugin    = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n".to_string(),
            // Indented, CRLF, quoted key, no space before `=`, last line without ending.
            "[[route]]\r\n  name = \"orders\"\r\n  \"plugin\"= \"v1.wasm\"\r\n  candidate= \"v2.wasm\"\r\n".to_string(),
            "[[route]]\nname = \"orders\"\nplugin = \"v1.wasm\"\ncandidate = \"v2.wasm\"".to_string(),
        ];
        for original in originals {
            let promoted = promote(&original);
            assert_ne!(promoted, original);
            assert_eq!(rollback(&promoted), original, "promoted:\n{promoted}");
        }
    }

    #[test]
    fn rollback_puts_previous_back_and_the_plugin_as_candidate() {
        let text = route("plugin = \"v2.wasm\"  # serving\nprevious = \"v1.wasm\"  # gone with its line\n");
        assert_eq!(rollback(&text), route("plugin = \"v1.wasm\"  # serving\ncandidate = \"v2.wasm\"\n"));
    }

    #[test]
    fn rollback_replaces_an_existing_candidate() {
        let text = route("candidate = \"v3.wasm\" # c\nplugin = \"v2.wasm\"\nprevious = \"v1.wasm\"\n");
        assert_eq!(rollback(&text), route("candidate = \"v2.wasm\" # c\nplugin = \"v1.wasm\"\n"));
    }

    #[test]
    fn comments_other_routes_and_layout_are_untouched() {
        let text = "\
# Routing for orders.
[store]
url = \"sqlite://x.db\"   # local

[[route]]
name = \"billing\"
plugin = \"billing.wasm\"
candidate = \"billing-next.wasm\"   # not this one

# The orders route.
[[route]]
source = { kind = \"push\" }
plugin  = \"v1.wasm\"   # serving now
name    = \"orders\"
candidate = \"v2.wasm\" # trying
target = { kind = \"log\" }

[route.retry]
initial = \"1s\"

[[route]]
name = \"audit\"
plugin = \"audit.wasm\"
";
        let expected = "\
# Routing for orders.
[store]
url = \"sqlite://x.db\"   # local

[[route]]
name = \"billing\"
plugin = \"billing.wasm\"
candidate = \"billing-next.wasm\"   # not this one

# The orders route.
[[route]]
source = { kind = \"push\" }
plugin  = \"v2.wasm\"   # serving now
previous = \"v1.wasm\"
name    = \"orders\"
target = { kind = \"log\" }

[route.retry]
initial = \"1s\"

[[route]]
name = \"audit\"
plugin = \"audit.wasm\"
";
        assert_eq!(promote(text), expected);
    }

    #[test]
    fn a_candidate_above_the_plugin_line_goes_and_previous_follows_plugin() {
        let text = route("candidate = \"v2.wasm\"  # next\n\tplugin = \"v1.wasm\"\n");
        assert_eq!(promote(&text), route("\tplugin = \"v2.wasm\"\n\tprevious = \"v1.wasm\"\n"));
    }

    #[test]
    fn a_plugin_on_the_last_line_without_ending_gets_its_new_line() {
        let text = "[[route]]\nname = \"orders\"\ncandidate = \"v2.wasm\"\nplugin = \"v1.wasm\"";
        assert_eq!(promote(text), "[[route]]\nname = \"orders\"\nplugin = \"v2.wasm\"\nprevious = \"v1.wasm\"");
    }

    #[test]
    fn route_not_found() {
        let err = apply(&route("plugin = \"a.wasm\"\n"), "billing", Step::Promote).unwrap_err();
        assert_eq!(err, EditError::RouteNotFound { route: "billing".into() });
        assert_eq!(err.to_string(), "route `billing` is not declared in this file");
    }

    #[test]
    fn a_name_used_twice_is_refused() {
        let text = format!("{}{}", route("plugin = \"a.wasm\"\n"), route("plugin = \"b.wasm\"\n"));
        assert_eq!(
            apply(&text, "orders", Step::Promote).unwrap_err(),
            EditError::DuplicateRoute { route: "orders".into(), count: 2 }
        );
    }

    #[test]
    fn promote_without_candidate_says_what_to_write() {
        let err = apply(&route("plugin = \"a.wasm\"\nprevious = \"z.wasm\"\n"), "orders", Step::Promote).unwrap_err();
        assert_eq!(err, EditError::NoCandidate { route: "orders".into() });
        assert!(err.to_string().contains("candidate = \"path/to/new.wasm\""), "{err}");
    }

    #[test]
    fn rollback_without_previous_says_what_to_write() {
        let err = apply(&route("plugin = \"a.wasm\"\ncandidate = \"b.wasm\"\n"), "orders", Step::Rollback).unwrap_err();
        assert_eq!(err, EditError::NoPrevious { route: "orders".into() });
        assert!(err.to_string().contains("plugin = \"path/to/old.wasm\""), "{err}");
    }

    #[test]
    fn a_route_without_plugin_is_refused() {
        let err = apply(&route("candidate = \"b.wasm\"\n"), "orders", Step::Promote).unwrap_err();
        assert_eq!(err, EditError::NoPlugin { route: "orders".into() });
    }

    #[test]
    fn invalid_toml_names_the_place_and_the_problem() {
        let err = apply("[[route]]\nname = \"orders\"\nplugin = \n", "orders", Step::Promote).unwrap_err();
        let EditError::InvalidToml { message } = &err else { panic!("unexpected {err:?}") };
        assert!(message.starts_with("line 3, column"), "{message}");
        assert!(err.to_string().starts_with("the routing file is not valid TOML: line 3"), "{err}");
    }

    #[test]
    fn routes_that_do_not_read_are_refused() {
        let err = apply("[[route]]\nplugin = \"a.wasm\"\n", "orders", Step::Promote).unwrap_err();
        let EditError::UnreadableRoutes { message } = &err else { panic!("unexpected {err:?}") };
        assert!(message.contains("missing field `name`"), "{message}");
        let err = apply("[route]\nname = \"orders\"\n", "orders", Step::Promote).unwrap_err();
        assert!(matches!(err, EditError::UnreadableRoutes { .. }), "{err:?}");
    }

    /// The key and the phrase a refused shape is reported with.
    fn refused(text: &str, step: Step) -> (&'static str, String, String) {
        match apply(text, "orders", step) {
            Err(EditError::ManualEdit { route, key, form, intended }) => {
                assert_eq!(route, "orders");
                (key, form, intended)
            }
            other => panic!("expected a manual edit, got {other:?}"),
        }
    }

    #[test]
    fn dotted_keys_are_refused_with_the_intended_lines() {
        let text = route("plugin.path = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n");
        let (key, form, intended) = refused(&text, Step::Promote);
        assert_eq!(key, "plugin");
        assert_eq!(form, "with dotted keys (`plugin.path = …`)");
        assert_eq!(intended, "    plugin = \"v2.wasm\"\n    previous = { path = \"v1.wasm\" }\nand no `candidate`");
        let err = apply(&text, "orders", Step::Promote).unwrap_err().to_string();
        assert!(err.contains("make the change by hand"), "{err}");
    }

    #[test]
    fn a_quoted_dotted_key_is_not_mistaken_for_a_string() {
        // toml spans the table at its first key, `"plugin"`, which reads as a string.
        let (key, form, _) = refused(&route("\"plugin\".path = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n"), Step::Promote);
        assert_eq!(key, "plugin");
        assert_eq!(form, "with dotted keys (`plugin.path = …`)");
    }

    #[test]
    fn a_dotted_candidate_is_refused() {
        let (key, _, _) = refused(&route("plugin = \"v1.wasm\"\ncandidate.path = \"v2.wasm\"\n"), Step::Promote);
        assert_eq!(key, "candidate");
    }

    #[test]
    fn a_plugin_sub_table_is_refused() {
        let text = "[[route]]\nname = \"orders\"\ncandidate = \"v2.wasm\"\n[route.plugin]\npath = \"v1.wasm\"\n";
        let (key, form, _) = refused(text, Step::Promote);
        assert_eq!((key, form.as_str()), ("plugin", "as a sub-table (`[route.plugin]`)"));
    }

    #[test]
    fn an_inline_route_table_is_refused() {
        let text = "route = [ { name = \"orders\", plugin = \"v1.wasm\", candidate = \"v2.wasm\" } ]\n";
        let (key, form, _) = refused(text, Step::Promote);
        assert_eq!((key, form.as_str()), ("plugin", "in an inline route table (`route = [ { … } ]`)"));
    }

    #[test]
    fn an_array_value_is_moved_not_taken_for_a_sub_table() {
        let text = route("plugin = [\"v1.wasm\"]\ncandidate = \"v2.wasm\"\n");
        assert_eq!(promote(&text), route("plugin = \"v2.wasm\"\nprevious = [\"v1.wasm\"]\n"));
    }

    #[test]
    fn a_value_over_several_lines_is_refused() {
        let text = route("plugin = \"v1.wasm\"\ncandidate = { path = \"v2.wasm\",\n    sha256 = \"00\" }\n");
        let (key, form, _) = refused(&text, Step::Promote);
        assert_eq!((key, form.as_str()), ("candidate", "over several lines"));
    }

    #[test]
    fn a_previous_in_an_unsafe_shape_is_refused_on_rollback() {
        let (key, _, intended) = refused(&route("plugin = \"v2.wasm\"\nprevious.path = \"v1.wasm\"\n"), Step::Rollback);
        assert_eq!(key, "previous");
        assert_eq!(intended, "    plugin = { path = \"v1.wasm\" }\n    candidate = \"v2.wasm\"\nand no `previous`");
    }

    #[test]
    fn an_escaped_key_spelling_is_refused() {
        let (key, form, _) =
            refused(&route("\"plu\\u0067in\" = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n"), Step::Promote);
        assert_eq!((key, form.as_str()), ("plugin", "other than as `plugin = …` alone on its line"));
    }

    #[test]
    fn the_self_check_catches_a_wrong_result() {
        let text = route("plugin = \"v1.wasm\"\ncandidate = \"v2.wasm\"\n");
        let document = parse_document(&text).unwrap();
        let (index, spans) = find_route(&text, "orders").unwrap();
        let plan = Plan::new("orders", Step::Promote, &spans).unwrap();
        // A result that drops the old plugin instead of keeping it as `previous`.
        let err = plan.check(&document, index, &route("plugin = \"v2.wasm\"\n")).unwrap_err();
        assert!(matches!(err, EditError::SelfCheck { .. }), "{err:?}");
        assert!(err.to_string().contains("the routing file was not changed"), "{err}");
        let err = plan.check(&document, index, "plugin = [").unwrap_err();
        assert!(err.to_string().contains("does not parse"), "{err}");
    }

    #[test]
    fn overlapping_edits_are_an_error_not_a_mangled_file() {
        let edits = vec![Edit::replace(0..4, "x"), Edit::replace(2..6, "y")];
        assert!(splice("abcdefgh", edits).is_err());
    }
}
