//! One routing file or a directory of them: finding the files, putting their routes
//! together (names unique across files), and deciding which errors stop everything
//! (the shared settings) and which refuse only a route or a team's file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::access::{AdminConfig, PushAuth};
use super::error::{ConfigError, ConfigErrorKind, ConfigErrors, line_col};
use super::raw::{self, Outline};
use super::validate::{self, DeclaredRoute, FileOutcome};
use super::{
    Config, Ordering, PluginsConfig, PubsubSource, RefusedRoute, RouteConfig, RouteName, ServerConfig, SourceConfig,
    StoreConfig,
};

/// The routing files `path` stands for: itself, or the `*.toml` files directly in the
/// directory, in name order.
pub fn routing_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "toml") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// The store of a routing file or directory, reading nothing else: no route, plugin
/// file or target secret needs to be valid (for `inlet inbox`).
pub fn load_store(path: &Path) -> Result<StoreConfig, ConfigErrors> {
    let env = |name: &str| std::env::var(name).ok();
    let files = routing_files(path).map_err(|e| read_error(path, &e))?;
    let mut declaring = None;
    for file in &files {
        let text = read(file)?;
        // A single file is the shared file whatever it holds; in a directory it is
        // the one with `[store]`.
        let holds_store = !path.is_dir() || raw::outline(text.readable()).is_some_and(|o| o.store.is_some());
        if holds_store {
            declaring = Some((file.clone(), text.utf8(file)?));
            break;
        }
    }
    let Some((file, text)) = declaring else {
        return Err(ConfigErrors::single(ConfigError::whole_file(path, ConfigErrorKind::NoStore)));
    };
    let only = raw::parse_store(&file, &text)?;
    validate::store_only(&file, &text, only.store.as_ref().map(|s| s.get_ref()), &env)
}

/// The route names the routing files declare, from their outline alone (a route whose
/// settings are wrong is still named), in file order: what `inlet route` acts on.
pub fn route_names(path: &Path) -> Result<Vec<String>, ConfigErrors> {
    let files = routing_files(path).map_err(|e| read_error(path, &e))?;
    let mut names = Vec::new();
    for file in &files {
        let outline = raw::outline(read(file)?.readable());
        names.extend(outline.into_iter().flat_map(|o| o.route).filter_map(|r| r.name));
    }
    Ok(names)
}

fn read_error(path: &Path, e: &std::io::Error) -> ConfigErrors {
    ConfigErrors::single(ConfigError::whole_file(path, ConfigErrorKind::Read(e.to_string())))
}

fn read(file: &Path) -> Result<Text, ConfigErrors> {
    std::fs::read(file).map(Text::from_bytes).map_err(|e| read_error(file, &e))
}

/// A routing file's contents: text, or bytes that are not UTF-8. The latter are read
/// with replacement characters only to find what the file declares (its route names,
/// whether it holds the shared settings), so that a team's broken file refuses only
/// that team's routes.
enum Text {
    Utf8(String),
    NotUtf8 { lossy: String, valid_up_to: usize },
}

impl Text {
    fn from_bytes(bytes: Vec<u8>) -> Text {
        match String::from_utf8(bytes) {
            Ok(text) => Text::Utf8(text),
            Err(e) => {
                let valid_up_to = e.utf8_error().valid_up_to();
                Text::NotUtf8 { lossy: String::from_utf8_lossy(e.as_bytes()).into_owned(), valid_up_to }
            }
        }
    }

    /// The text, with replacement characters where it is not UTF-8.
    fn readable(&self) -> &str {
        match self {
            Text::Utf8(t) | Text::NotUtf8 { lossy: t, .. } => t,
        }
    }

    /// The text, or the error naming the first byte that is not UTF-8.
    fn utf8(self, file: &Path) -> Result<String, ConfigErrors> {
        match self {
            Text::Utf8(t) => Ok(t),
            Text::NotUtf8 { lossy, valid_up_to } => Err(ConfigErrors::single(not_utf8(file, &lossy, valid_up_to))),
        }
    }
}

fn not_utf8(file: &Path, lossy: &str, valid_up_to: usize) -> ConfigError {
    // Up to the first bad byte the lossy text and the file agree, so the position holds.
    let kind = ConfigErrorKind::Parse("the file is not UTF-8 text (a routing file must be UTF-8)".into());
    ConfigError::at(file, lossy, valid_up_to..valid_up_to, "", kind)
}

/// One file's text checked, or the reason it could not be.
struct Checked {
    file: PathBuf,
    text: String,
    outcome: Result<FileOutcome, ConfigErrors>,
    /// Where `[store]` and `[server]` are declared, when they are.
    store_at: Option<usize>,
    server_at: Option<usize>,
    plugins_at: Option<usize>,
    admin_at: Option<usize>,
    push_at: Option<usize>,
    /// Where `[[grant]]` is declared: only the shared file may.
    grant_at: Option<usize>,
    /// Route names of the file's outline, when it could be read (for a file refused
    /// whole).
    outline_names: Vec<RouteName>,
}

/// Checks one file; `granted` is `None` for the shared file, else the variables the
/// shared file grants to this one.
fn check_file(
    file: PathBuf,
    text: String,
    env: &dyn Fn(&str) -> Option<String>,
    granted: Option<&BTreeSet<String>>,
) -> Checked {
    let outcome = raw::parse(&file, &text).map(|raw| validate::validate_file(&file, &text, raw, env, granted));
    outlined(file, text, outcome)
}

/// Whether a file's outline declares one of the shared settings, which makes it the
/// shared file (the first such file of a directory; see [`shared_file`]).
fn declares_shared(o: &Outline) -> bool {
    o.store.is_some() || o.server.is_some() || o.plugins.is_some() || o.admin.is_some() || o.push.is_some()
}

/// A checked file with what its outline declares: where the shared tables are, and
/// the route names of a file that did not parse.
fn outlined(file: PathBuf, text: String, outcome: Result<FileOutcome, ConfigErrors>) -> Checked {
    let outline: Option<Outline> = raw::outline(&text);
    let store_at = outline.as_ref().and_then(|o| o.store.as_ref()).map(|s| s.span().start);
    let server_at = outline.as_ref().and_then(|o| o.server.as_ref()).map(|s| s.span().start);
    let plugins_at = outline.as_ref().and_then(|o| o.plugins.as_ref()).map(|s| s.span().start);
    let admin_at = outline.as_ref().and_then(|o| o.admin.as_ref()).map(|s| s.span().start);
    let push_at = outline.as_ref().and_then(|o| o.push.as_ref()).map(|s| s.span().start);
    let grant_at = outline.as_ref().and_then(|o| o.grant.as_ref()).map(|s| s.span().start);
    let outline_names = match outline {
        Some(o) => o.route.into_iter().filter_map(|r| RouteName::try_from(r.name?).ok()).collect(),
        None => Vec::new(),
    };
    Checked { file, text, outcome, store_at, server_at, plugins_at, admin_at, push_at, grant_at, outline_names }
}

/// A file that is not UTF-8: refused with an error at its first bad byte; what it
/// declares is read from its text with replacement characters, so it refuses only its
/// own routes, unless it is the file with the shared settings.
fn not_utf8_file(file: PathBuf, lossy: String, valid_up_to: usize) -> Checked {
    let error = not_utf8(&file, &lossy, valid_up_to);
    outlined(file, lossy, Err(ConfigErrors::single(error)))
}

pub(super) fn from_text(path: &Path, text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
    // A single file is all the platform's: it may read every variable.
    let checked = check_file(path.to_path_buf(), text.to_string(), env, None);
    assemble(path, vec![checked], false)
}

pub(super) fn load(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
    let is_dir = path.is_dir();
    let files = read_version(path).map_err(|(file, e)| read_error(&file, &e))?;
    let texts = files.into_iter().map(|(file, bytes)| (file, Text::from_bytes(bytes))).collect();
    check_texts(path, is_dir, texts, env)
}

/// How often a directory that keeps changing is read again before its last read is
/// taken as it is (each read takes well under a millisecond; a kubelet swap, a few).
const READS_OF_A_MOVING_DIRECTORY: u32 = 10;

/// The routing files of a routing file or directory as one version: each file's path
/// (as the folder shows it) and bytes.
pub type Version = Vec<(PathBuf, Vec<u8>)>;

/// The routing files of `path` as one [`Version`].
///
/// A directory can change while it is read. kubelet updates a mounted ConfigMap by
/// writing the new version into a folder of its own, pointing `..data` at it (the one
/// atomic step), then making the links of new keys (`KEY -> ..data/KEY`), removing
/// those of keys gone, and removing the old folder. Read through the folder's own
/// listing, a version can come out torn: a key made by the swap and not yet linked is
/// missing, and a key's link resolved through the old folder just before its removal
/// finds nothing, although the key is still there (seen as a refused reload, 1 in some
/// thousands, in tests/configmap.rs). So a folder with a `..data` link is read through
/// the version folder that link names (listing and files, shown under the folder's own
/// names), and any directory is read until the looks before and after the read agree
/// (its listing and where `..data` points), a few times at most; a read that failed
/// while the look moved is read again rather than taken as an unreadable file. A file
/// that fails to read while nothing moves is an error. kubelet names each version's
/// folder afresh, so an unchanged `..data` means no swap happened in between.
pub fn read_version(path: &Path) -> Result<Version, (PathBuf, std::io::Error)> {
    let is_dir = path.is_dir();
    let mut tries = 0;
    loop {
        let before = look(path, is_dir);
        let version =
            before.as_ref().and_then(|(_, data)| data.as_deref()).map(|data| path.join(data)).filter(|v| v.is_dir());
        let read = read_files(path, version.as_deref());
        tries += 1;
        if !is_dir || tries >= READS_OF_A_MOVING_DIRECTORY || look(path, is_dir) == before {
            return read;
        }
    }
}

/// What a directory holds now: its routing files and the target of its `..data` link.
fn look(path: &Path, is_dir: bool) -> Option<(Vec<PathBuf>, Option<PathBuf>)> {
    is_dir.then(|| (routing_files(path).unwrap_or_default(), std::fs::read_link(path.join("..data")).ok()))
}

/// The routing files of `path` and their bytes, as the directory is at this moment;
/// those of a projected volume from `version`, the folder its `..data` names.
fn read_files(path: &Path, version: Option<&Path>) -> Result<Version, (PathBuf, std::io::Error)> {
    let is_dir = version.is_some() || path.is_dir();
    let listed = version.unwrap_or(path);
    let files = routing_files(listed).map_err(|e| (listed.to_path_buf(), e))?;
    let mut read = Vec::new();
    for file in files {
        let shown = match (version, file.file_name()) {
            (Some(_), Some(name)) => path.join(name),
            _ => file.clone(),
        };
        let bytes = match std::fs::read(&file) {
            // A file of a plain directory gone since the listing (a team file
            // deleted) was removed, not broken: read the directory as it is now,
            // without it, rather than refuse the whole reload for a moment's race.
            Err(_) if is_dir && version.is_none() && !file.is_file() => continue,
            Err(e) => return Err((shown, e)),
            Ok(bytes) => bytes,
        };
        read.push((shown, bytes));
    }
    Ok(read)
}

/// Checks the texts of a routing file or directory, each against what it may read.
fn check_texts(
    path: &Path,
    is_dir: bool,
    texts: Vec<(PathBuf, Text)>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    // The grants come from the shared file, and every team file is checked against
    // them: a team file reads only the variables granted to it, by its name.
    let shared = if is_dir {
        texts.iter().position(|(_, t)| raw::outline(t.readable()).is_some_and(|o| declares_shared(&o)))
    } else {
        Some(0)
    };
    let mut grants: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if let (true, Some(s)) = (is_dir, shared) {
        for g in raw::grants(texts[s].1.readable()) {
            grants.entry(g.file.into_inner()).or_default().extend(g.env.into_iter().map(|e| e.into_inner()));
        }
    }
    let none = BTreeSet::new();
    let mut checked = Vec::new();
    for (i, (file, text)) in texts.into_iter().enumerate() {
        let granted = if Some(i) == shared {
            None
        } else {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            Some(grants.get(&name).unwrap_or(&none))
        };
        checked.push(match text {
            Text::Utf8(text) => check_file(file, text, env, granted),
            Text::NotUtf8 { lossy, valid_up_to } => not_utf8_file(file, lossy, valid_up_to),
        });
    }
    assemble(path, checked, is_dir)
}

/// Errors collected over several files: sorted by file (in name order), then position.
#[derive(Default)]
struct Errors(Vec<(usize, ConfigError)>);

impl Errors {
    fn add(&mut self, file: usize, errors: impl IntoIterator<Item = ConfigError>) {
        self.0.extend(errors.into_iter().map(|e| (file, e)));
    }

    fn into_sorted(mut self) -> ConfigErrors {
        self.0.sort_by_key(|(f, e)| (*f, e.line, e.column));
        ConfigErrors(self.0.into_iter().map(|(_, e)| e).collect())
    }
}

/// Puts the checked files together. Fatal (`Err`): errors in the shared settings,
/// the shared settings declared twice or (in a directory) not at all, or a shared file
/// that does not parse — then with every other error too, so one run shows them all.
fn assemble(path: &Path, checked: Vec<Checked>, is_dir: bool) -> Result<Config, ConfigErrors> {
    let mut fatal = Errors::default();
    let mut refused_errors = Errors::default();
    let shared = shared_file(path, &checked, is_dir, &mut fatal);
    let names: Vec<String> = checked.iter().map(|c| c.file.display().to_string()).collect();

    let mut store: Option<StoreConfig> = None;
    let mut server: Option<ServerConfig> = None;
    let mut plugins: Option<PluginsConfig> = None;
    let mut admin: Option<AdminConfig> = None;
    let mut push_default: Option<PushAuth> = None;
    let mut grants = BTreeMap::new();
    let mut refused = Vec::new();
    // Per refused route: whether `[push] auth` is its push authentication (it writes
    // no valid `source.auth` of its own), applied once the shared file is read.
    let mut refused_default: Vec<bool> = Vec::new();
    let mut routes = Vec::new();
    // Each route name and where it was first declared: (file index, line).
    let mut first: BTreeMap<RouteName, (usize, usize)> = BTreeMap::new();
    let mut readers = Readers::default();
    for (i, c) in checked.into_iter().enumerate() {
        let mut outcome = c.outcome;
        // A team file cannot grant itself anything: refused whole.
        if let (true, false, Some(at)) = (is_dir, Some(i) == shared, c.grant_at) {
            let kind = ConfigErrorKind::Invalid(
                "`[[grant]]` belongs in the shared routing file (the one with `[store]`): a team file cannot grant variables"
                    .into(),
            );
            let error = ConfigError::at(&c.file, &c.text, at..at, "grant", kind);
            let mut errors = match outcome {
                Ok(o) => o
                    .shared_errors
                    .into_iter()
                    .chain(o.routes.into_iter().filter_map(|d| d.result.err()).flatten())
                    .collect(),
                Err(e) => e.0,
            };
            errors.push(error);
            errors.sort_by_key(|e| (e.line, e.column));
            outcome = Err(ConfigErrors(errors));
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(errors) if Some(i) == shared => {
                fatal.add(i, errors.0);
                continue;
            }
            Err(errors) => {
                refused_errors.add(i, errors.0.clone());
                let mut names: Vec<Option<RouteName>> = c.outline_names.into_iter().map(Some).collect();
                if names.is_empty() {
                    names.push(None);
                }
                for name in names {
                    refused.push(RefusedRoute { file: c.file.clone(), name, errors: errors.clone(), push_auth: None });
                    refused_default.push(true);
                }
                continue;
            }
        };
        fatal.add(i, outcome.shared_errors);
        if Some(i) == shared {
            store = outcome.store;
            server = outcome.server;
            plugins = outcome.plugins;
            admin = outcome.admin;
            push_default = outcome.push_default;
            grants = outcome.grants;
        }
        // A variable the file was not granted refuses the whole file, not just the
        // route that reads it: the file asked for what is not its own.
        let ungranted: Vec<ConfigError> = outcome
            .routes
            .iter()
            .filter_map(|d| d.result.as_ref().err())
            .flatten()
            .filter(|e| matches!(e.kind, ConfigErrorKind::NotGranted { .. }))
            .cloned()
            .collect();
        for declared in outcome.routes {
            let DeclaredRoute { name, index, at, result, own_auth, writes_auth } = declared;
            let result = match result {
                Ok(_) if !ungranted.is_empty() => Err(ungranted.clone()),
                Err(mut errors) if !ungranted.is_empty() => {
                    errors.extend(ungranted.iter().filter(|u| !errors.contains(u)).cloned().collect::<Vec<_>>());
                    Err(errors)
                }
                other => other,
            };
            let result = match first.get(&name) {
                None => {
                    first.insert(name.clone(), (i, at.0));
                    result
                }
                Some(&(file, line)) => {
                    let kind = if file == i {
                        ConfigErrorKind::DuplicateRoute { name: name.to_string(), first_line: line }
                    } else {
                        ConfigErrorKind::DuplicateRouteAcrossFiles {
                            name: name.to_string(),
                            first_file: names[file].clone(),
                            first_line: line,
                        }
                    };
                    let dup = ConfigError {
                        file: c.file.clone(),
                        line: at.0,
                        column: at.1,
                        field: format!("route[{index}].name"),
                        kind,
                    };
                    let mut errors = result.err().unwrap_or_default();
                    errors.push(dup);
                    Err(errors)
                }
            };
            let result = match result {
                Ok(route) => match readers.conflict(&route, i, at, &names) {
                    None => Ok(route),
                    Some((field, problem)) => Err(vec![ConfigError {
                        file: c.file.clone(),
                        line: at.0,
                        column: at.1,
                        field: format!("route[{index}].source.{field}"),
                        kind: ConfigErrorKind::Invalid(problem),
                    }]),
                },
                other => other,
            };
            match result {
                Ok(route) => routes.push(route),
                Err(mut errors) => {
                    errors.sort_by_key(|e| (e.line, e.column));
                    errors.dedup();
                    refused_errors.add(i, errors.clone());
                    refused.push(RefusedRoute {
                        file: c.file.clone(),
                        name: Some(name),
                        errors: ConfigErrors(errors),
                        push_auth: own_auth.clone(),
                    });
                    refused_default.push(own_auth.is_none() || !writes_auth);
                }
            }
        }
    }
    if !fatal.0.is_empty() {
        fatal.0.extend(refused_errors.0);
        return Err(fatal.into_sorted());
    }
    let store = match store {
        Some(s) => s,
        // Only a single file gets here without a store (a directory needs one).
        None => validate::default_store(path.parent().unwrap_or(Path::new(""))),
    };
    let server = server.unwrap_or_default();
    // `[push] auth` is the default of every push route, whichever file declares it.
    for route in routes.iter_mut().filter(|r| matches!(r.source, SourceConfig::Push(_)) && r.push_auth.is_none()) {
        route.push_auth = push_default.clone();
    }
    for (r, default) in refused.iter_mut().zip(refused_default) {
        if default && r.push_auth.is_none() {
            r.push_auth = push_default.clone();
        }
    }
    // `{route}` in an audience is the route's name: one route's token is no good for another.
    for route in routes.iter_mut() {
        let name = route.name.to_string();
        per_route_audience(&mut route.push_auth, &name);
    }
    for r in refused.iter_mut() {
        if let Some(name) = &r.name {
            per_route_audience(&mut r.push_auth, name.as_str());
        }
    }
    Ok(Config {
        path: path.to_path_buf(),
        store,
        server,
        plugins: plugins.unwrap_or_default(),
        admin: admin.unwrap_or_default(),
        routes,
        refused,
        grants,
    })
}

/// The pull routes accepted so far, by subscription: several routes may read one
/// subscription only from one file (a team's file cannot take another's messages),
/// each with a `select` by the same attribute, no two selecting the same value, all
/// giving the subscription the same settings and ordering.
#[derive(Default)]
struct Readers(
    BTreeMap<String, Vec<Reader>>,
    BTreeMap<(String, String), (String, usize, usize)>,
    /// Push subscriptions by name: the route each sends to, its file and line.
    BTreeMap<String, (String, usize, usize)>,
);

struct Reader {
    route: String,
    file: usize,
    line: usize,
    source: PubsubSource,
    ordering: Ordering,
}

impl Readers {
    /// Why `route` (declared in file `file` at `at`) cannot read its subscription (the
    /// source field at fault and the problem), or `None` once it is counted among the
    /// subscription's readers.
    fn conflict(
        &mut self,
        route: &RouteConfig,
        file: usize,
        at: (usize, usize),
        names: &[String],
    ) -> Option<(&'static str, String)> {
        if let SourceConfig::Outbox(outbox) = &route.source {
            // One route per outbox table: two would each publish every row.
            let key = (outbox.url.expose().to_string(), outbox.table.clone());
            if let Some((other, f, line)) = self.1.get(&key) {
                return Some((
                    "table",
                    format!(
                        "outbox table {} of {} is already read by route {other} at {}:{line}: one route publishes an \
                         outbox",
                        outbox.table, outbox.url_shown, names[*f]
                    ),
                ));
            }
            self.1.insert(key, (route.name.to_string(), file, at.0));
            return None;
        }
        if let SourceConfig::Push(push) = &route.source {
            // A push subscription sends to one endpoint, and is not pulled as well:
            // whoever got a message first would take it from the other.
            let name = &push.subscription.as_ref()?.name;
            if let Some((other, f, line)) = self.2.get(name) {
                let problem = format!(
                    "subscription {name} already pushes to route {other} at {}:{line}: it has one push endpoint",
                    names[*f]
                );
                return Some(("subscription", problem));
            }
            if let Some(r) = self.0.get(name).and_then(|readers| readers.first()) {
                let problem = format!(
                    "subscription {name} is pulled by route {} at {}:{}: a subscription is pushed or pulled, not both",
                    r.route, names[r.file], r.line
                );
                return Some(("subscription", problem));
            }
            self.2.insert(name.clone(), (route.name.to_string(), file, at.0));
            return None;
        }
        let SourceConfig::Pubsub(source) = &route.source else { return None };
        if let Some((other, f, line)) = self.2.get(&source.subscription) {
            let problem = format!(
                "subscription {} pushes to route {other} at {}:{line}: a subscription is pushed or pulled, not both",
                source.subscription, names[*f]
            );
            return Some(("subscription", problem));
        }
        let readers = self.0.entry(source.subscription.clone()).or_default();
        for r in readers.iter() {
            let first = format!("route {} at {}:{}", r.route, names[r.file], r.line);
            if r.file != file {
                return Some((
                    "subscription",
                    format!(
                        "subscription {} is already read by {first}: the routes of one subscription belong in one routing file",
                        source.subscription
                    ),
                ));
            }
            let (Some(mine), Some(theirs)) = (&source.select, &r.source.select) else {
                return Some((
                    "select",
                    format!(
                        "subscription {} is also read by {first}: routes that share a subscription each need \
                     `source.select` (which messages each takes)",
                        source.subscription
                    ),
                ));
            };
            if mine.attribute != theirs.attribute {
                return Some((
                    "select",
                    format!(
                        "selects by attribute `{}`, {first} by `{}`: routes that share a subscription select by one \
                     attribute, so that no message is wanted by two of them",
                        mine.attribute, theirs.attribute
                    ),
                ));
            }
            if let Some(value) = mine.overlap(theirs) {
                return Some((
                    "select",
                    format!(
                        "selects `{} = {value:?}`, as {first} does: a message of one subscription goes to one route",
                        mine.attribute
                    ),
                ));
            }
            if !source.same_subscription_settings(&r.source) || route.ordering != r.ordering {
                return Some((
                    "subscription",
                    format!(
                        "reads subscription {} with other settings than {first}: routes that share a subscription give it \
                     the same source settings (all but `select`) and the same `ordering`",
                        source.subscription
                    ),
                ));
            }
        }
        readers.push(Reader {
            route: route.name.to_string(),
            file,
            line: at.0,
            source: source.clone(),
            ordering: route.ordering,
        });
        None
    }
}

fn per_route_audience(auth: &mut Option<PushAuth>, route: &str) {
    if let Some(PushAuth::Oidc(o)) = auth {
        o.audience = o.audience.replace("{route}", route);
    }
}

/// Which file holds the shared settings. A single file always does. In a directory,
/// the first that declares `[store]` or `[server]`; another one declaring either is a
/// fatal error naming both, and so is none at all.
fn shared_file(path: &Path, checked: &[Checked], is_dir: bool, fatal: &mut Errors) -> Option<usize> {
    if !is_dir {
        return Some(0);
    }
    let mut shared: Option<usize> = None;
    for (i, c) in checked.iter().enumerate() {
        let tables = [
            ("store", c.store_at),
            ("server", c.server_at),
            ("plugins", c.plugins_at),
            ("admin", c.admin_at),
            ("push", c.push_at),
        ];
        for (table, at) in tables {
            let Some(at) = at else { continue };
            match shared {
                None => shared = Some(i),
                Some(s) if s == i => {}
                Some(s) => {
                    let first = &checked[s];
                    let first_at = match table {
                        "store" => first.store_at,
                        "server" => first.server_at,
                        "plugins" => first.plugins_at,
                        "admin" => first.admin_at,
                        _ => first.push_at,
                    }
                    .or(first.store_at)
                    .or(first.server_at)
                    .unwrap_or(0);
                    let kind = ConfigErrorKind::SharedSettingsTwice {
                        table,
                        first_file: first.file.display().to_string(),
                        first_line: line_col(&first.text, first_at).0,
                    };
                    fatal.add(i, [ConfigError::at(&c.file, &c.text, at..at, table, kind)]);
                }
            }
        }
    }
    match shared {
        Some(s) if checked[s].store_at.is_some() => {}
        _ => fatal.add(usize::MAX, [ConfigError::whole_file(path, ConfigErrorKind::NoStore)]),
    }
    shared
}
