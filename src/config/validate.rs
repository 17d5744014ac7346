//! Phase two: environment expansion, defaults and the checks serde cannot make.

mod access;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::access::{AdminConfig, PushAuth};
use super::error::{ConfigError, ConfigErrorKind, ConfigErrors, line_col};
use super::raw::{
    FetchKind, HumanDuration, RawConfig, RawFetch, RawGrant, RawLimits, RawPlugin, RawPlugins, RawRoute, RawSelect,
    RawServer, RawSource, RawStore, SourceKind, TargetKind,
};
use super::{
    AfterPublish, FetchConfig, FetchStore, HttpTarget, KeySource, NotYetPolicy, Ordering, OutboxColumns, OutboxSource,
    ParkedPolicy, PluginFile, PluginLimits, PluginsConfig, PubsubSource, PubsubTarget, PushSource, PushSubscription,
    RetryPolicy, RouteConfig, RouteName, Select, ServerConfig, SourceConfig, StoreConfig, SubscriptionSetup,
    TargetConfig, Unwrapped,
};

/// Collects errors while a file is checked, so all of them are reported at once.
struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
    /// The variables this file may read: `None` for the shared file (or a single
    /// file), which may read any; a team file only those granted to it.
    granted: Option<&'a BTreeSet<String>>,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn error<T>(&mut self, span: std::ops::Range<usize>, field: impl Into<String>, kind: ConfigErrorKind) -> Option<T> {
        self.errors.push(ConfigError::at(self.file, self.text, span, field, kind));
        None
    }

    /// Expands `${NAME}` references; `$$` is a literal `$`. A variable not granted to
    /// this file is an error and is not read at all. Messages about the value quote
    /// the file's spelling (`value.get_ref()`), never what this returns: the result
    /// may hold a secret.
    fn expand(&mut self, value: &Spanned<String>, field: &str) -> Option<String> {
        let s = value.get_ref();
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(inner) = after.strip_prefix('{') {
                let Some(end) = inner.find('}') else {
                    return self.error(value.span(), field, ConfigErrorKind::UnterminatedEnvRef);
                };
                let name = &inner[..end];
                if let Some(granted) = self.granted
                    && !granted.contains(name)
                {
                    let file = self.file.file_name().unwrap_or_default().to_string_lossy().into_owned();
                    return self.error(
                        value.span(),
                        field,
                        ConfigErrorKind::NotGranted { name: name.to_string(), file },
                    );
                }
                match (self.env)(name) {
                    Some(v) => out.push_str(&v),
                    None => return self.error(value.span(), field, ConfigErrorKind::UnknownEnvVar(name.to_string())),
                }
                rest = &inner[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        Some(out)
    }
}

impl Checker<'_> {
    /// Reports each field written that a kind does not take, at the field itself.
    fn stray(
        &mut self,
        fields: &[(&str, Option<std::ops::Range<usize>>)],
        allowed: &[&str],
        at: &str,
        kind: &'static str,
    ) {
        for (field, span) in fields {
            if let Some(span) = span
                && !allowed.contains(field)
            {
                self.error::<()>(
                    span.clone(),
                    format!("{at}.{field}"),
                    ConfigErrorKind::FieldNotAllowed { field: field.to_string(), kind },
                );
            }
        }
    }

    /// A required Pub/Sub resource name of the form `projects/P/<collection>/NAME`.
    fn resource<T>(
        &mut self,
        value: &Option<Spanned<String>>,
        table: &Spanned<T>,
        at: &str,
        field: &'static str,
        collection: &str,
        kind: &'static str,
    ) -> Option<String> {
        let Some(v) = value else {
            return self.error(table.span(), at, ConfigErrorKind::MissingField { field, kind });
        };
        self.optional_resource(v, &format!("{at}.{field}"), collection)
    }

    fn optional_resource(&mut self, v: &Spanned<String>, field: &str, collection: &str) -> Option<String> {
        let name = self.expand(v, field)?;
        let parts: Vec<&str> = name.split('/').collect();
        let well_formed = parts.len() == 4
            && parts[0] == "projects"
            && parts[2] == collection
            && parts.iter().all(|p| !p.is_empty() && !p.contains(char::is_whitespace));
        if well_formed {
            Some(name)
        } else {
            self.error(
                v.span(),
                field,
                ConfigErrorKind::Invalid(format!(
                    "`{}` is not a name of the form projects/PROJECT/{collection}/NAME",
                    v.get_ref()
                )),
            )
        }
    }

    /// An optional duration that must be more than zero.
    fn positive(&mut self, d: &Option<Spanned<HumanDuration>>, field: &str) -> Option<Duration> {
        let d = d.as_ref()?;
        if d.get_ref().0.is_zero() {
            return self.error(d.span(), field, ConfigErrorKind::Invalid("must be more than zero".into()));
        }
        Some(d.get_ref().0)
    }

    /// An optional duration more than zero and at most `max`.
    fn at_most(&mut self, d: &Option<Spanned<HumanDuration>>, field: &str, max: Duration) -> Option<Duration> {
        let value = self.positive(d, field)?;
        if value > max {
            let span = d.as_ref().expect("positive saw a value").span();
            let max = humantime::format_duration(max);
            return self.error(span, field, ConfigErrorKind::Invalid(format!("must be at most {max}")));
        }
        Some(value)
    }

    /// An optional whole number within `range`.
    fn within(&mut self, n: &Option<Spanned<u32>>, field: &str, range: std::ops::RangeInclusive<u32>) -> Option<u32> {
        let n = n.as_ref()?;
        if !range.contains(n.get_ref()) {
            let (lo, hi) = range.into_inner();
            return self.error(n.span(), field, ConfigErrorKind::Invalid(format!("must be between {lo} and {hi}")));
        }
        Some(*n.get_ref())
    }
}

/// The message retention Pub/Sub accepts on a subscription.
const RETAIN_ACKED_MIN: Duration = Duration::from_secs(10 * 60);
const RETAIN_ACKED_MAX: Duration = Duration::from_secs(31 * 24 * 3600);

fn source(c: &mut Checker<'_>, i: usize, r: &RawRoute) -> Option<SourceConfig> {
    let at = format!("route[{i}].source");
    let s = r.source.get_ref();
    let fields = [
        ("subscription", s.subscription.as_ref().map(|v| v.span())),
        ("topic", s.topic.as_ref().map(|v| v.span())),
        ("max_outstanding_messages", s.max_outstanding_messages.as_ref().map(|v| v.span())),
        ("max_outstanding_mib", s.max_outstanding_mib.as_ref().map(|v| v.span())),
        ("batch_size", s.batch_size.as_ref().map(|v| v.span())),
        ("batch_wait", s.batch_wait.as_ref().map(|v| v.span())),
        ("lease_extension", s.lease_extension.as_ref().map(|v| v.span())),
        ("dead_letter_topic", s.dead_letter_topic.as_ref().map(|v| v.span())),
        ("max_delivery_attempts", s.max_delivery_attempts.as_ref().map(|v| v.span())),
        ("retain_acked", s.retain_acked.as_ref().map(|v| v.span())),
        ("filter", s.filter.as_ref().map(|v| v.span())),
        ("exactly_once", s.exactly_once.as_ref().map(|v| v.span())),
        ("redelivery_backoff", s.redelivery_backoff.as_ref().map(|v| v.span())),
        ("select", s.select.as_ref().map(|v| v.span())),
        ("url", s.url.as_ref().map(|v| v.span())),
        ("table", s.table.as_ref().map(|v| v.span())),
        ("columns", s.columns.as_ref().map(|v| v.span())),
        ("after_publish", s.after_publish.as_ref().map(|v| v.span())),
        ("poll", s.poll.as_ref().map(|v| v.span())),
        ("channel", s.channel.as_ref().map(|v| v.span())),
    ];
    let auth_kind = match s.kind.get_ref() {
        SourceKind::Pubsub => Some("a pubsub source"),
        SourceKind::Outbox => Some("an outbox source"),
        SourceKind::Push => None,
    };
    if let (Some(kind), Some(a)) = (auth_kind, &s.auth) {
        c.error::<()>(a.span(), format!("{at}.auth"), ConfigErrorKind::FieldNotAllowed { field: "auth".into(), kind });
    }
    match s.kind.get_ref() {
        SourceKind::Push => {
            c.stray(&fields, &PUSH_SETUP_FIELDS, &at, "a push source");
            let settings: Vec<_> = fields
                .iter()
                .filter(|(f, _)| *f != "subscription" && PUSH_SETUP_FIELDS.contains(f))
                .chain(&[("endpoint", s.endpoint.as_ref().map(|v| v.span()))])
                .cloned()
                .collect();
            Some(SourceConfig::Push(push_source(c, s, &at, &settings)))
        }
        SourceKind::Outbox => {
            let push_only = [
                ("wrapper", s.wrapper.as_ref().map(|v| v.span())),
                ("attributes", s.attributes.as_ref().map(|v| v.span())),
                ("endpoint", s.endpoint.as_ref().map(|v| v.span())),
            ];
            c.stray(&push_only, &[], &at, "an outbox source");
            c.stray(&fields, &OUTBOX_FIELDS, &at, "an outbox source");
            outbox_source(c, s, &r.source, &at).map(SourceConfig::Outbox)
        }
        SourceKind::Pubsub => {
            c.stray(&fields[fields.len() - OUTBOX_FIELDS.len() + 1..], &[], &at, "a pubsub source");
            let push_only = [
                ("wrapper", s.wrapper.as_ref().map(|v| v.span())),
                ("attributes", s.attributes.as_ref().map(|v| v.span())),
                ("endpoint", s.endpoint.as_ref().map(|v| v.span())),
            ];
            c.stray(&push_only, &[], &at, "a pubsub source");
            let subscription =
                c.resource(&s.subscription, &r.source, &at, "subscription", "subscriptions", "a pubsub source");
            let setup = subscription_setup(c, s, &at);
            let max_outstanding_messages =
                c.within(&s.max_outstanding_messages, &format!("{at}.max_outstanding_messages"), 1..=100_000);
            let max_outstanding_mib = c.within(&s.max_outstanding_mib, &format!("{at}.max_outstanding_mib"), 1..=4096);
            let batch_size = c.within(&s.batch_size, &format!("{at}.batch_size"), 1..=5000);
            let batch_wait = dur(&s.batch_wait).unwrap_or(Duration::from_millis(5));
            if let Some(w) = &s.batch_wait
                && w.get_ref().0 > Duration::from_secs(1)
            {
                c.error::<()>(
                    w.span(),
                    format!("{at}.batch_wait"),
                    ConfigErrorKind::Invalid("must be at most 1s: it delays every lone message".into()),
                );
            }
            let lease_extension = dur(&s.lease_extension).unwrap_or(Duration::from_secs(60));
            if let Some(l) = &s.lease_extension
                && !(Duration::from_secs(10)..=Duration::from_secs(600)).contains(&l.get_ref().0)
            {
                c.error::<()>(
                    l.span(),
                    format!("{at}.lease_extension"),
                    ConfigErrorKind::Invalid("must be between 10s and 600s (the broker's ack deadline range)".into()),
                );
            }
            let max_outstanding_messages = max_outstanding_messages.unwrap_or(1000) as usize;
            let batch_size = (batch_size.unwrap_or(500) as usize).min(max_outstanding_messages);
            subscription.map(|subscription| {
                SourceConfig::Pubsub(PubsubSource {
                    subscription,
                    max_outstanding_messages,
                    max_outstanding_bytes: (max_outstanding_mib.unwrap_or(100) as usize) << 20,
                    batch_size,
                    batch_wait,
                    lease_extension,
                    setup,
                    exactly_once: s.exactly_once.as_ref().is_some_and(|e| *e.get_ref()),
                    select: s.select.as_ref().and_then(|sel| select(c, sel, &format!("{at}.select"))),
                })
            })
        }
    }
}

/// The fields an outbox source takes (`batch_size` first: the others close the
/// list of a source's fields, in this order).
const OUTBOX_FIELDS: [&str; 7] = ["batch_size", "url", "table", "columns", "after_publish", "poll", "channel"];

/// An outbox source: the database by reference, plain identifiers for the table and
/// its columns (they are written into SQL), and its reading settings.
fn outbox_source(c: &mut Checker<'_>, s: &RawSource, whole: &Spanned<RawSource>, at: &str) -> Option<OutboxSource> {
    let url = match &s.url {
        None => c.error(whole.span(), at, ConfigErrorKind::MissingField { field: "url", kind: "an outbox source" }),
        Some(u) => {
            let field = format!("{at}.url");
            if !is_reference(u.get_ref()) {
                c.error::<()>(
                    u.span(),
                    &field,
                    ConfigErrorKind::Invalid(
                        "must be a reference, exactly `\"${NAME}\"`: a database URL holds a password, and the routing \
                         file is read by many"
                            .into(),
                    ),
                );
                None
            } else {
                c.expand(u, &field).and_then(|url| {
                    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                        Some(url)
                    } else {
                        c.error(
                            u.span(),
                            &field,
                            ConfigErrorKind::Invalid(format!(
                                "`{}` does not hold a postgres:// URL; an outbox is read from PostgreSQL",
                                u.get_ref()
                            )),
                        )
                    }
                })
            }
        }
    };
    let table = match &s.table {
        None => Some("outbox".to_string()),
        Some(t) => {
            let parts: Vec<&str> = t.get_ref().split('.').collect();
            if parts.len() <= 2 && parts.iter().all(|p| plain_identifier(p)) {
                Some(t.get_ref().clone())
            } else {
                c.error(
                    t.span(),
                    format!("{at}.table"),
                    ConfigErrorKind::Invalid(format!(
                        "`{}` is not a plain table name (`name` or `schema.name`: lowercase letters, digits and `_`)",
                        t.get_ref()
                    )),
                )
            }
        }
    };
    let mut columns = OutboxColumns::default();
    let mut columns_ok = true;
    if let Some(raw) = &s.columns {
        let raw = raw.get_ref();
        let given = [
            ("id", &raw.id, &mut columns.id),
            ("aggregate", &raw.aggregate, &mut columns.aggregate),
            ("type", &raw.event_type, &mut columns.event_type),
            ("payload", &raw.payload, &mut columns.payload),
            ("created", &raw.created, &mut columns.created),
            ("published", &raw.published, &mut columns.published),
        ];
        for (name, value, slot) in given {
            let Some(value) = value else { continue };
            if plain_identifier(value.get_ref()) {
                *slot = value.get_ref().clone();
            } else {
                columns_ok = false;
                c.error::<()>(
                    value.span(),
                    format!("{at}.columns.{name}"),
                    ConfigErrorKind::Invalid(format!(
                        "`{}` is not a plain column name (lowercase letters, digits and `_`)",
                        value.get_ref()
                    )),
                );
            }
        }
    }
    let poll = c.at_most(&s.poll, &format!("{at}.poll"), Duration::from_secs(60)).unwrap_or(Duration::from_secs(1));
    let batch_size = c.within(&s.batch_size, &format!("{at}.batch_size"), 1..=5000).unwrap_or(500) as usize;
    let channel = match &s.channel {
        None => Some("inlet_outbox".to_string()),
        Some(ch) if plain_identifier(ch.get_ref()) => Some(ch.get_ref().clone()),
        Some(ch) => c.error(
            ch.span(),
            format!("{at}.channel"),
            ConfigErrorKind::Invalid(format!(
                "`{}` is not a plain channel name (lowercase letters, digits and `_`)",
                ch.get_ref()
            )),
        ),
    };
    let shown = s.url.as_ref().map(|u| u.get_ref().clone()).unwrap_or_default();
    let after_publish = s.after_publish.as_ref().map_or(AfterPublish::Mark, |a| *a.get_ref());
    columns_ok.then_some(())?;
    Some(OutboxSource {
        url: crate::config::Secret::new(url?),
        url_shown: shown,
        table: table?,
        columns,
        after_publish,
        poll,
        batch_size,
        channel: channel?,
    })
}

/// Whether a value is exactly `${NAME}`: a secret given by reference, never written
/// into the routing file itself.
fn is_reference(text: &str) -> bool {
    text.strip_prefix("${")
        .and_then(|t| t.strip_suffix('}'))
        .is_some_and(|n| !n.is_empty() && n.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_'))
}

/// A name written into SQL as it is: lowercase ASCII letters, digits and `_`, not
/// starting with a digit, at most 63 bytes (PostgreSQL's limit).
fn plain_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|ch: char| ch.is_ascii_digit())
        && name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
}

/// `source.select`: a plain attribute name and one value (`equals`) or several
/// (`in`), not both.
fn select(c: &mut Checker<'_>, sel: &Spanned<RawSelect>, at: &str) -> Option<Select> {
    let raw = sel.get_ref();
    let attribute = raw.attribute.get_ref();
    if attribute.is_empty() || attribute.len() > 256 || attribute.chars().any(char::is_control) {
        let problem = "must be an attribute's name: 1 to 256 bytes, no control characters";
        return c.error(raw.attribute.span(), format!("{at}.attribute"), ConfigErrorKind::Invalid(problem.into()));
    }
    let values: Vec<String> = match (&raw.equals, &raw.one_of) {
        (Some(v), None) => vec![v.get_ref().clone()],
        (None, Some(list)) if !list.get_ref().is_empty() => {
            let mut values: Vec<String> = Vec::new();
            for v in list.get_ref() {
                if values.contains(v.get_ref()) {
                    let problem = format!("`{}` is listed twice", v.get_ref());
                    return c.error(v.span(), format!("{at}.in"), ConfigErrorKind::Invalid(problem));
                }
                values.push(v.get_ref().clone());
            }
            values
        }
        (None, Some(list)) => {
            let problem = "must list at least one value";
            return c.error(list.span(), format!("{at}.in"), ConfigErrorKind::Invalid(problem.into()));
        }
        _ => {
            let problem = "needs exactly one of `equals = \"value\"` and `in = [\"value\", …]`";
            return c.error(sel.span(), at, ConfigErrorKind::Invalid(problem.into()));
        }
    };
    Some(Select { attribute: attribute.clone(), values })
}

/// The fields a push source takes besides its own: its subscription, for setup.
const PUSH_SETUP_FIELDS: [&str; 7] = [
    "subscription",
    "topic",
    "dead_letter_topic",
    "max_delivery_attempts",
    "retain_acked",
    "filter",
    "redelivery_backoff",
];

/// What `inlet pubsub setup` gives a route's subscription, pull or push: the topic,
/// dead-letter policy, acked-message retention, filter and redelivery backoff.
fn subscription_setup(c: &mut Checker<'_>, s: &RawSource, at: &str) -> SubscriptionSetup {
    let topic = s.topic.as_ref().and_then(|t| c.optional_resource(t, &format!("{at}.topic"), "topics"));
    let dead_letter_topic =
        s.dead_letter_topic.as_ref().and_then(|t| c.optional_resource(t, &format!("{at}.dead_letter_topic"), "topics"));
    let max_delivery_attempts = c.within(&s.max_delivery_attempts, &format!("{at}.max_delivery_attempts"), 5..=100);
    let retain_acked = dur(&s.retain_acked);
    if let Some(r) = &s.retain_acked
        && !(RETAIN_ACKED_MIN..=RETAIN_ACKED_MAX).contains(&r.get_ref().0)
    {
        c.error::<()>(
            r.span(),
            format!("{at}.retain_acked"),
            ConfigErrorKind::Invalid("must be between 10m and 31d (Pub/Sub's message retention range)".into()),
        );
    }
    let filter = s.filter.as_ref().and_then(|f| {
        let text = f.get_ref();
        if text.trim().is_empty() || text.len() > 256 {
            let problem = "must be a Pub/Sub filter of 1 to 256 bytes, e.g. 'attributes.type = \"order\"'";
            return c.error(f.span(), format!("{at}.filter"), ConfigErrorKind::Invalid(problem.into()));
        }
        Some(text.clone())
    });
    SubscriptionSetup {
        topic,
        dead_letter_topic,
        max_delivery_attempts: max_delivery_attempts.unwrap_or(10),
        retain_acked,
        filter,
        redelivery_backoff: redelivery_backoff(c, s.redelivery_backoff.as_ref(), at),
    }
}

/// `redelivery_backoff = ["least", "most"]`: two durations of Pub/Sub's range (0s to
/// 600s), the least first; the default when not set (and after an error, which is
/// reported).
fn redelivery_backoff(
    c: &mut Checker<'_>,
    given: Option<&Spanned<Vec<Spanned<HumanDuration>>>>,
    at: &str,
) -> (Duration, Duration) {
    let default = SubscriptionSetup::DEFAULT_REDELIVERY_BACKOFF;
    let Some(given) = given else { return default };
    let field = format!("{at}.redelivery_backoff");
    let most = Duration::from_secs(600);
    let problem = match given.get_ref().as_slice() {
        [least, longest] if least.get_ref().0 > most || longest.get_ref().0 > most => {
            "each must be at most 600s (Pub/Sub's range)"
        }
        [least, longest] if least.get_ref().0 > longest.get_ref().0 => "the least must come first",
        [least, longest] => return (least.get_ref().0, longest.get_ref().0),
        _ => "must be two durations, the least and the most, e.g. [\"1s\", \"60s\"]",
    };
    c.error::<()>(given.span(), field, ConfigErrorKind::Invalid(problem.into()));
    default
}

/// Headers an unwrapped push route may not take as attributes: HTTP's own, and the
/// ones Pub/Sub writes its metadata to.
const NOT_ATTRIBUTES: [&str; 12] = [
    "accept",
    "authorization",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
];

/// A push source's `wrapper` and `attributes`.
fn push_source(
    c: &mut Checker<'_>,
    s: &RawSource,
    at: &str,
    settings: &[(&str, Option<std::ops::Range<usize>>)],
) -> PushSource {
    let subscription = push_subscription(c, s, at, settings);
    let wrapped = s.wrapper.as_ref().is_none_or(|w| *w.get_ref());
    let Some(names) = &s.attributes else {
        return PushSource { unwrapped: (!wrapped).then(Unwrapped::default), subscription };
    };
    if wrapped {
        let problem = "lists the headers of an unwrapped push: it needs `wrapper = false` (a wrapped push carries \
                       its attributes in the envelope)";
        c.error::<()>(names.span(), format!("{at}.attributes"), ConfigErrorKind::Invalid(problem.into()));
        return PushSource { unwrapped: None, subscription };
    }
    let mut attributes: Vec<String> = Vec::new();
    for (i, name) in names.get_ref().iter().enumerate() {
        let field = format!("{at}.attributes[{i}]");
        let text = name.get_ref();
        let lower = text.to_ascii_lowercase();
        let token = !text.is_empty()
            && text.len() <= 256
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let problem = if !token {
            Some(format!("`{}` is not an HTTP header name", text.escape_default()))
        } else if lower.starts_with("x-goog-") || NOT_ATTRIBUTES.contains(&lower.as_str()) {
            Some(format!("`{text}` is a header of HTTP or of Pub/Sub's metadata, not an attribute"))
        } else if attributes.iter().any(|a| a.eq_ignore_ascii_case(text)) {
            Some(format!("`{text}` is listed twice (header names are case-insensitive)"))
        } else {
            None
        };
        match problem {
            Some(problem) => {
                c.error::<()>(name.span(), field, ConfigErrorKind::Invalid(problem));
            }
            None => attributes.push(text.clone()),
        }
    }
    PushSource { unwrapped: Some(Unwrapped { attributes }), subscription }
}

/// A push route's subscription for `inlet pubsub setup`: `subscription` and `endpoint`
/// together (the subscription sends to the endpoint), and the settings a subscription
/// takes; settings without a subscription to give them to are refused.
/// `settings`: the subscription's fields as written (name, where).
fn push_subscription(
    c: &mut Checker<'_>,
    s: &RawSource,
    at: &str,
    settings: &[(&str, Option<std::ops::Range<usize>>)],
) -> Option<PushSubscription> {
    let Some(name) = &s.subscription else {
        for (field, span) in settings {
            if let Some(span) = span.clone() {
                let problem = format!(
                    "sets the push subscription's {field} for `inlet pubsub setup`, but names no `subscription` (and \
                     `endpoint`) to set it on"
                );
                c.error::<()>(span, format!("{at}.{field}"), ConfigErrorKind::Invalid(problem));
            }
        }
        return None;
    };
    let name = c.optional_resource(name, &format!("{at}.subscription"), "subscriptions");
    let endpoint = match &s.endpoint {
        None => {
            let span = s.subscription.as_ref().map(|v| v.span()).unwrap_or_default();
            let problem = "a push route's subscription needs `endpoint`: the URL Pub/Sub sends to, this route's \
                           /push/<route> as the world reaches it";
            c.error::<String>(span, format!("{at}.endpoint"), ConfigErrorKind::Invalid(problem.into()))
        }
        Some(e) => c.expand(e, &format!("{at}.endpoint")).and_then(|url| {
            let parsed =
                reqwest::Url::parse(&url).ok().filter(|u| matches!(u.scheme(), "https" | "http") && u.host().is_some());
            match parsed {
                Some(_) => Some(url),
                None => c.error(
                    e.span(),
                    format!("{at}.endpoint"),
                    ConfigErrorKind::Invalid(format!("`{}` is not an https:// (or http://) URL", e.get_ref())),
                ),
            }
        }),
    };
    let setup = subscription_setup(c, s, at);
    Some(PushSubscription { name: name?, endpoint: endpoint?, setup })
}

/// The `[server]` table: the listener and the limits that protect it.
fn server(c: &mut Checker<'_>, s: &RawServer) -> Option<ServerConfig> {
    let defaults = ServerConfig::default();
    let listen = match &s.listen {
        None => Some(defaults.listen),
        Some(listen) => c.expand(listen, "server.listen").and_then(|l| match l.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => c.error(
                listen.span(),
                "server.listen",
                ConfigErrorKind::Invalid(format!("`{}` is not a HOST:PORT socket address", listen.get_ref())),
            ),
        }),
    };
    let max_body_mib = c.within(&s.max_body_mib, "server.max_body_mib", 1..=64);
    let max_concurrent_pushes = c.within(&s.max_concurrent_pushes, "server.max_concurrent_pushes", 1..=100_000);
    let header_read_timeout = c.at_most(&s.header_read_timeout, "server.header_read_timeout", Duration::from_secs(300));
    let request_timeout = c.at_most(&s.request_timeout, "server.request_timeout", Duration::from_secs(600));
    let max_connections = c.within(&s.max_connections, "server.max_connections", 1..=1_000_000);
    let max_per_peer = c.within(&s.max_connections_per_peer, "server.max_connections_per_peer", 1..=1_000_000);
    let mut public_hosts = Vec::new();
    for (i, host) in s.public_hosts.iter().flatten().enumerate() {
        let field = format!("server.public_hosts[{i}]");
        let name = host.get_ref().trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if valid {
            public_hosts.push(name);
        } else {
            let problem =
                format!("`{}` is not a host name (no scheme, port or path: `inlet.example.com`)", host.get_ref());
            c.error::<()>(host.span(), &field, ConfigErrorKind::Invalid(problem));
        }
    }
    let listen = listen?;
    Some(ServerConfig {
        listen,
        max_body_bytes: max_body_mib.map_or(defaults.max_body_bytes, |m| (m as usize) << 20),
        header_read_timeout: header_read_timeout.unwrap_or(defaults.header_read_timeout),
        request_timeout: request_timeout.unwrap_or(defaults.request_timeout),
        max_concurrent_pushes: max_concurrent_pushes.map_or(defaults.max_concurrent_pushes, |n| n as usize),
        public_hosts,
        max_connections: max_connections.map_or(defaults.max_connections, |n| n as usize),
        max_connections_per_peer: max_per_peer.map_or(defaults.max_connections_per_peer, |n| n as usize),
    })
}

fn dur(d: &Option<Spanned<HumanDuration>>) -> Option<Duration> {
    d.as_ref().map(|d| d.get_ref().0)
}

/// What one routing file contributes: the shared settings if it declares them, and
/// each of its routes, valid or with its errors. A route's errors refuse only it.
pub(super) struct FileOutcome {
    /// `[store]`, when declared and valid.
    pub store: Option<StoreConfig>,
    /// `[server]`, when declared and valid.
    pub server: Option<ServerConfig>,
    /// `[plugins]`, when declared and valid.
    pub plugins: Option<PluginsConfig>,
    /// `[admin]`, when declared and valid.
    pub admin: Option<AdminConfig>,
    /// `[push] auth`, when declared and valid: the default of push routes that set
    /// none (applied across files by `files::assemble`).
    pub push_default: Option<PushAuth>,
    /// `[[grant]]`: each team file's name and the variables it may read.
    pub grants: BTreeMap<String, BTreeSet<String>>,
    /// Errors in `[store]`, `[server]` or `[plugins]`: without those nothing can run.
    pub shared_errors: Vec<ConfigError>,
    pub routes: Vec<DeclaredRoute>,
}

/// A `[[route]]` table as declared: where its name is, and the route or its errors.
pub(super) struct DeclaredRoute {
    pub name: RouteName,
    /// Index in its file, for the `route[i]` field path.
    pub index: usize,
    /// Line and column of the name.
    pub at: (usize, usize),
    pub result: Result<RouteConfig, Vec<ConfigError>>,
    /// The route's own `source.auth` when it is valid, and whether it writes one:
    /// what a push to the route must pass even while the route is refused.
    pub own_auth: Option<PushAuth>,
    pub writes_auth: bool,
}

pub(super) fn validate_file(
    file: &Path,
    text: &str,
    raw: RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    granted: Option<&BTreeSet<String>>,
) -> FileOutcome {
    let mut c = Checker { file, text, env, granted, errors: Vec::new() };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();

    let store = raw.store.as_ref().and_then(|s| store_section(&mut c, &base, s.get_ref()));
    let server = raw.server.as_ref().and_then(|s| server(&mut c, s.get_ref()));
    let plugins = raw.plugins.as_ref().map(|p| plugins_section(&mut c, p.get_ref()));
    let admin = raw.admin.as_ref().map(|a| access::admin(&mut c, &base, Some(a)));
    let push_default =
        raw.push.as_ref().and_then(|p| p.auth.as_ref()).and_then(|a| access::push_auth(&mut c, a, "push.auth"));
    // A team file's `[[grant]]` is refused whole in `files::assemble`.
    let grants = if granted.is_none() { grants(&mut c, &raw.grants) } else { BTreeMap::new() };
    let shared_errors = std::mem::take(&mut c.errors);

    let routes = raw
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            // A push route's own `source.auth`; one without gets `[push] auth` later.
            let writes_auth = r.source.get_ref().auth.is_some();
            let push_auth = match (r.source.get_ref().kind.get_ref(), &r.source.get_ref().auth) {
                (SourceKind::Push, Some(a)) => access::push_auth(&mut c, a, &format!("route[{i}].source.auth")),
                _ => None,
            };
            let own_auth = push_auth.clone();
            let result = route(&mut c, &base, i, r)
                .map(|route| RouteConfig { push_auth, ..route })
                .ok_or_else(|| std::mem::take(&mut c.errors));
            // A route with errors returns none; one without may still have pushed some.
            let result = match result {
                Ok(_) if !c.errors.is_empty() => Err(std::mem::take(&mut c.errors)),
                other => other,
            };
            DeclaredRoute {
                name: r.name.get_ref().clone(),
                index: i,
                at: line_col(text, r.name.span().start),
                result,
                own_auth,
                writes_auth,
            }
        })
        .collect();
    FileOutcome { store, server, plugins, admin, push_default, grants, shared_errors, routes }
}

/// `[[grant]]`: which variables each team file may read. A grant names a file by its
/// name alone (team files are the `*.toml` files beside this one) and variables by
/// their names; granting to the shared file itself means nothing and is refused.
fn grants(c: &mut Checker<'_>, raw: &[RawGrant]) -> BTreeMap<String, BTreeSet<String>> {
    let own = c.file.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (i, g) in raw.iter().enumerate() {
        let file = g.file.get_ref();
        let plain = !file.is_empty() && !file.contains(['/', '\\']) && file.ends_with(".toml");
        if !plain {
            c.error::<()>(
                g.file.span(),
                format!("grant[{i}].file"),
                ConfigErrorKind::Invalid(format!(
                    "`{file}` is not the name of a routing file in this directory (`NAME.toml`, no folder)"
                )),
            );
            continue;
        }
        if own.as_deref() == Some(file.as_str()) {
            c.error::<()>(
                g.file.span(),
                format!("grant[{i}].file"),
                ConfigErrorKind::Invalid("the shared file may read every variable; grant to team files only".into()),
            );
            continue;
        }
        let names = out.entry(file.clone()).or_default();
        for (j, name) in g.env.iter().enumerate() {
            let n = name.get_ref();
            if n.is_empty() || !n.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_') {
                c.error::<()>(
                    name.span(),
                    format!("grant[{i}].env[{j}]"),
                    ConfigErrorKind::Invalid(format!(
                        "`{n}` is not a variable name (letters, digits and `_`; write NAME, not `${{NAME}}`)"
                    )),
                );
                continue;
            }
            names.insert(n.clone());
        }
    }
    out
}

/// `[plugins]`: the process-wide plugin memory budgets (serving, shadow) and the
/// shadow's pacing.
fn plugins_section(c: &mut Checker<'_>, p: &RawPlugins) -> PluginsConfig {
    let mut plugins = PluginsConfig::default();
    let mut budget = |mib: &Option<Spanned<u32>>, field: &str, bytes: &mut usize| {
        let Some(mib) = mib else { return };
        if !(16..=1 << 20).contains(mib.get_ref()) {
            c.error::<()>(mib.span(), field, ConfigErrorKind::Invalid("must be between 16 and 1048576".into()));
        }
        *bytes = (*mib.get_ref() as usize) << 20;
    };
    budget(&p.memory_budget_mib, "plugins.memory_budget_mib", &mut plugins.memory_budget_bytes);
    budget(&p.shadow_memory_budget_mib, "plugins.shadow_memory_budget_mib", &mut plugins.shadow_memory_budget_bytes);
    if let Some(percent) = &p.shadow_cpu_percent {
        if !(1..=100).contains(percent.get_ref()) {
            let problem = ConfigErrorKind::Invalid("must be between 1 and 100 (percent of one core)".into());
            c.error::<()>(percent.span(), "plugins.shadow_cpu_percent", problem);
        }
        plugins.shadow_cpu_percent = *percent.get_ref();
    }
    if let Some(mib) = &p.shadow_memory_churn_mib_per_s {
        if !(1..=65536).contains(mib.get_ref()) {
            let problem = ConfigErrorKind::Invalid("must be between 1 and 65536 (MiB per second)".into());
            c.error::<()>(mib.span(), "plugins.shadow_memory_churn_mib_per_s", problem);
        }
        plugins.shadow_memory_churn_mib_per_s = *mib.get_ref();
    }
    plugins
}

/// The `[store]` section alone (also what `inlet inbox` reads).
fn store_section(c: &mut Checker<'_>, base: &Path, s: &RawStore) -> Option<StoreConfig> {
    let max_connections = s.max_connections.as_ref().map_or(8, |m| *m.get_ref());
    if max_connections == 0 {
        let span = s.max_connections.as_ref().map(|m| m.span()).unwrap_or_default();
        c.error::<()>(span, "store.max_connections", ConfigErrorKind::Invalid("must be at least 1".into()));
    }
    c.expand(&s.url, "store.url").and_then(|url| {
        if let Some(path) = url.strip_prefix("sqlite://") {
            Some(StoreConfig { url: sqlite_url(base, path), max_connections })
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(StoreConfig { url, max_connections })
        } else {
            c.error(
                s.url.span(),
                "store.url",
                ConfigErrorKind::Invalid(format!(
                    "store url `{}` must start with sqlite:// or postgres://",
                    crate::redact::url(s.url.get_ref())
                )),
            )
        }
    })
}

/// Validates only the store section of `file` (absent: the default beside the file).
pub(super) fn store_only(
    file: &Path,
    text: &str,
    raw: Option<&RawStore>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreConfig, ConfigErrors> {
    let mut c = Checker { file, text, env, granted: None, errors: Vec::new() };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let Some(raw) = raw else { return Ok(default_store(&base)) };
    store_section(&mut c, &base, raw).ok_or(ConfigErrors(c.errors))
}

/// `sqlite://inlet.db` beside the routing file.
pub(super) fn default_store(base: &Path) -> StoreConfig {
    StoreConfig { url: sqlite_url(base, "inlet.db"), max_connections: 8 }
}

fn sqlite_url(base: &Path, path: &str) -> String {
    let p = Path::new(path);
    let full = if p.is_absolute() || path.starts_with(':') { p.to_path_buf() } else { base.join(p) };
    format!("sqlite://{}", full.display())
}

fn route(c: &mut Checker<'_>, base: &Path, i: usize, r: &RawRoute) -> Option<RouteConfig> {
    let at = |f: &str| format!("route[{i}].{f}");

    // Messages and the API show the path as the file spells it.
    let written = r.plugin.get_ref().path(r.plugin.span());
    let path_field = if r.plugin.get_ref().sha256().is_some() { at("plugin.path") } else { at("plugin") };
    let plugin_shown = base.join(written.get_ref());
    let plugin = c.expand(&written, &path_field).and_then(|p| {
        let path: PathBuf = base.join(&p);
        // Looked up twice: a path through kubelet's `..data` link that resolved to the
        // folder a ConfigMap swap is just removing finds nothing, while a second lookup
        // already goes through the new folder. A file really missing is missing twice.
        if path.is_file() || path.is_file() {
            Some(path)
        } else {
            c.error(
                written.span(),
                &path_field,
                ConfigErrorKind::MissingPluginFile { path: plugin_shown.display().to_string() },
            )
        }
    });
    let plugin_sha256 = r.plugin.get_ref().sha256().map(|pin| plugin_pin(c, pin, &at("plugin.sha256")));
    let candidate = r.candidate.as_ref().map(|p| other_plugin(c, base, p, &at("candidate")));
    let previous = r.previous.as_ref().map(|p| other_plugin(c, base, p, &at("previous")));

    let source = source(c, i, r);

    let t = r.target.get_ref();
    let target_fields = [
        ("url", t.url.as_ref().map(|u| u.span())),
        ("timeout", t.timeout.as_ref().map(|d| d.span())),
        ("headers", t.headers.as_ref().map(|h| h.span())),
        ("topic", t.topic.as_ref().map(|h| h.span())),
        ("ordering_key", t.ordering_key.as_ref().map(|h| h.span())),
        ("attributes", t.attributes.as_ref().map(|h| h.span())),
    ];
    let target = match t.kind.get_ref() {
        TargetKind::Log => {
            c.stray(&target_fields, &[], &at("target"), "a log target");
            Some(TargetConfig::Log)
        }
        TargetKind::Pubsub => {
            c.stray(
                &target_fields,
                &["topic", "ordering_key", "attributes", "timeout"],
                &at("target"),
                "a pubsub target",
            );
            let topic = c.resource(&t.topic, &r.target, &at("target"), "topic", "topics", "a pubsub target");
            let mut attributes = BTreeMap::new();
            for (k, v) in t.attributes.iter().flat_map(|h| h.get_ref()) {
                if let Some(v) = c.expand(v, &at(&format!("target.attributes.{k}"))) {
                    attributes.insert(k.clone(), v);
                }
            }
            let timeout = c.positive(&t.timeout, &at("target.timeout")).unwrap_or(Duration::from_secs(10));
            let ordering_key = t.ordering_key.as_ref().is_some_and(|o| *o.get_ref());
            topic.map(|topic| {
                TargetConfig::Pubsub(PubsubTarget { topic, ordering_key, timeout, attributes, id_attribute: None })
            })
        }
        TargetKind::Http => {
            c.stray(&target_fields, &["url", "timeout", "headers"], &at("target"), "an http target");
            let url = match &t.url {
                None => c.error(
                    r.target.span(),
                    at("target"),
                    ConfigErrorKind::MissingField { field: "url", kind: "an http target" },
                ),
                Some(u) => c.expand(u, &at("target.url")).and_then(|url| {
                    if url.starts_with("http://") || url.starts_with("https://") {
                        Some(url.trim_end_matches('/').to_string())
                    } else {
                        c.error(
                            u.span(),
                            at("target.url"),
                            ConfigErrorKind::Invalid(format!(
                                "`{}` is not an http:// or https:// URL",
                                crate::redact::url(u.get_ref())
                            )),
                        )
                    }
                }),
            };
            let mut headers = BTreeMap::new();
            for (k, v) in t.headers.iter().flat_map(|h| h.get_ref()) {
                let field = at(&format!("target.headers.{k}"));
                if axum::http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    c.error::<()>(v.span(), &field, ConfigErrorKind::Invalid(format!("`{k}` is not a header name")));
                    continue;
                }
                if let Some(value) = c.expand(v, &field) {
                    // Checked here rather than at each delivery; the value is not shown.
                    if axum::http::HeaderValue::from_str(&value).is_err() {
                        let message = format!(
                            "`{}` is not a valid header value once expanded (a line break or control character; value not shown)",
                            v.get_ref().escape_debug()
                        );
                        c.error::<()>(v.span(), &field, ConfigErrorKind::Invalid(message));
                        continue;
                    }
                    headers.insert(k.to_ascii_lowercase(), value);
                }
            }
            let timeout = c.positive(&t.timeout, &at("target.timeout")).unwrap_or(Duration::from_secs(10));
            url.map(|url| TargetConfig::Http(HttpTarget { url, timeout, headers }))
        }
    };

    let concurrency = r.concurrency.as_ref().map_or(8, |c| *c.get_ref());
    if concurrency == 0 {
        c.error::<()>(
            r.concurrency.as_ref().unwrap().span(),
            at("concurrency"),
            ConfigErrorKind::Invalid("must be at least 1".into()),
        );
    }

    // From the raw target, so a target with another mistake (say, no url) still
    // gets its lease checked against the timeout the user wrote.
    let timeout = match t.kind.get_ref() {
        TargetKind::Http | TargetKind::Pubsub => dur(&t.timeout).unwrap_or(Duration::from_secs(10)),
        TargetKind::Log => TargetConfig::Log.timeout(),
    };
    let max_steps = r.max_steps.as_ref().map_or(3, |m| *m.get_ref());
    if let Some(m) = &r.max_steps
        && !(1..=10).contains(m.get_ref())
    {
        c.error::<()>(m.span(), at("max_steps"), ConfigErrorKind::Invalid("must be between 1 and 10".into()));
    }
    // One attempt may send up to `max_steps` requests, each up to the timeout.
    let exchange = timeout * max_steps.clamp(1, 10);
    let lease = dur(&r.lease).unwrap_or(exchange + Duration::from_secs(5));
    if let Some(l) = &r.lease
        && l.get_ref().0 < exchange + Duration::from_secs(1)
    {
        let what = if max_steps > 1 {
            format!("{max_steps} steps × the target timeout {}", humantime::format_duration(timeout))
        } else {
            format!("the target timeout {}", humantime::format_duration(timeout))
        };
        c.error::<()>(
            l.span(),
            at("lease"),
            ConfigErrorKind::Invalid(format!(
                "lease {} must exceed {what} by at least 1s, or a slow target could be delivered to twice",
                humantime::format_duration(l.get_ref().0),
            )),
        );
    }

    let mut retry = RetryPolicy::default();
    if let Some(rr) = &r.retry {
        retry.initial = dur(&rr.initial).unwrap_or(retry.initial);
        retry.max = dur(&rr.max).unwrap_or(retry.max);
        if let Some(m) = &rr.multiplier {
            retry.multiplier = *m.get_ref();
            if !(retry.multiplier >= 1.0 && retry.multiplier <= 100.0) {
                c.error::<()>(
                    m.span(),
                    at("retry.multiplier"),
                    ConfigErrorKind::Invalid("must be between 1.0 and 100.0".into()),
                );
            }
        }
        if let Some(j) = &rr.jitter {
            retry.jitter = *j.get_ref();
            if !(0.0..=1.0).contains(&retry.jitter) {
                c.error::<()>(
                    j.span(),
                    at("retry.jitter"),
                    ConfigErrorKind::Invalid("must be between 0.0 and 1.0".into()),
                );
            }
        }
        if let Some(m) = &rr.max_attempts {
            retry.max_attempts = *m.get_ref();
            if retry.max_attempts == 0 {
                c.error::<()>(
                    m.span(),
                    at("retry.max_attempts"),
                    ConfigErrorKind::Invalid("must be at least 1".into()),
                );
            }
        }
        if retry.max < retry.initial {
            // Point at whichever of the two the user wrote: `max` if given, else `initial`
            // (it then exceeds the default `max`).
            match (&rr.max, &rr.initial) {
                (Some(m), _) => c.error::<()>(
                    m.span(),
                    at("retry.max"),
                    ConfigErrorKind::Invalid(format!(
                        "must not be smaller than retry.initial ({})",
                        humantime::format_duration(retry.initial)
                    )),
                ),
                (None, Some(i)) => c.error::<()>(
                    i.span(),
                    at("retry.initial"),
                    ConfigErrorKind::Invalid(format!(
                        "must not be larger than retry.max (default {})",
                        humantime::format_duration(retry.max)
                    )),
                ),
                (None, None) => None,
            };
        }
    }

    let mut not_yet = NotYetPolicy::default();
    if let Some(n) = &r.not_yet {
        not_yet.deadline = dur(&n.deadline).unwrap_or(not_yet.deadline);
        not_yet.max_interval = dur(&n.max_interval).unwrap_or(not_yet.max_interval);
    }

    let limits = r.limits.as_ref().map(|l| plugin_limits(c, l, &at)).unwrap_or_default();
    let mut target = target;
    let key_source = match (&source, &mut target) {
        (Some(SourceConfig::Outbox(_)), target) => outbox_route(c, r, target, &at),
        _ => r.correlation_key.unwrap_or_default(),
    };

    Some(RouteConfig {
        name: r.name.get_ref().clone(),
        file: c.file.to_path_buf(),
        plugin: plugin?,
        plugin_shown,
        plugin_sha256: plugin_sha256.flatten(),
        candidate: candidate.flatten(),
        previous: previous.flatten(),
        source: source?,
        target: target?,
        ordering: r.ordering.unwrap_or(Ordering::PerKey),
        key_source,
        parked: r.parked.unwrap_or(ParkedPolicy::BlockKey),
        concurrency: concurrency.max(1) as usize,
        lease,
        max_steps: max_steps.clamp(1, 10),
        retry,
        not_yet,
        limits,
        push_auth: None,
        fetch: match &r.fetch {
            Some(f) => Some(fetch(c, f, &at("fetch"))?),
            None => None,
        },
    })
}

/// A route's claim-check store: an address, a token by reference only, attribute
/// names, and limits.
fn fetch(c: &mut Checker<'_>, f: &Spanned<RawFetch>, at: &str) -> Option<FetchConfig> {
    let raw = f.get_ref();
    let fields = [
        ("bucket", raw.bucket.as_ref().map(|v| v.span())),
        ("endpoint", raw.endpoint.as_ref().map(|v| v.span())),
        ("prefix", raw.prefix.as_ref().map(|v| v.span())),
        ("region", raw.region.as_ref().map(|v| v.span())),
        ("access_key_id", raw.access_key_id.as_ref().map(|v| v.span())),
        ("secret_access_key", raw.secret_access_key.as_ref().map(|v| v.span())),
        ("token", raw.token.as_ref().map(|v| v.span())),
    ];
    let required = |c: &mut Checker<'_>, v: &Option<Spanned<String>>, field: &'static str, kind: &'static str| match v {
        Some(v) => Some(v.clone()),
        None => c.error(f.span(), at, ConfigErrorKind::MissingField { field, kind }),
    };
    let reference = |c: &mut Checker<'_>, v: &Spanned<String>, field: &str| -> Option<crate::config::Secret> {
        if !is_reference(v.get_ref()) {
            return c.error(
                v.span(),
                field,
                ConfigErrorKind::Invalid(
                    "must be a reference, exactly `\"${NAME}\"`: the routing file must not hold the secret itself"
                        .into(),
                ),
            );
        }
        c.expand(v, field).map(crate::config::Secret::new)
    };
    let http_url = |c: &mut Checker<'_>, v: &Spanned<String>, field: &str| -> Option<String> {
        let url = c.expand(v, field)?;
        if url.starts_with("http://") || url.starts_with("https://") {
            Some(url)
        } else {
            c.error(
                v.span(),
                field,
                ConfigErrorKind::Invalid(format!("`{}` is not an http:// or https:// URL", v.get_ref())),
            )
        }
    };
    let store = match raw.kind.get_ref() {
        FetchKind::S3 => {
            let kind = "an s3 store";
            c.stray(&fields, &["bucket", "endpoint", "region", "access_key_id", "secret_access_key"], at, kind);
            let endpoint =
                required(c, &raw.endpoint, "endpoint", kind).and_then(|e| http_url(c, &e, &format!("{at}.endpoint")));
            let bucket = required(c, &raw.bucket, "bucket", kind).and_then(|b| c.expand(&b, &format!("{at}.bucket")));
            let region = match &raw.region {
                Some(r) => c.expand(r, &format!("{at}.region")),
                None => Some("us-east-1".to_string()),
            };
            let access_key_id = required(c, &raw.access_key_id, "access_key_id", kind)
                .and_then(|k| reference(c, &k, &format!("{at}.access_key_id")));
            let secret_access_key = required(c, &raw.secret_access_key, "secret_access_key", kind)
                .and_then(|k| reference(c, &k, &format!("{at}.secret_access_key")));
            match (endpoint, bucket, region, access_key_id, secret_access_key) {
                (Some(endpoint), Some(bucket), Some(region), Some(access_key_id), Some(secret_access_key)) => {
                    Some(FetchStore::S3 {
                        endpoint: endpoint.trim_end_matches('/').to_string(),
                        bucket,
                        region,
                        access_key_id,
                        secret_access_key,
                    })
                }
                _ => None,
            }
        }
        FetchKind::Gcs => {
            c.stray(&fields, &["bucket", "endpoint", "token"], at, "a gcs store");
            let endpoint = match &raw.endpoint {
                Some(e) => http_url(c, e, &format!("{at}.endpoint")),
                None => Some("https://storage.googleapis.com".to_string()),
            };
            let bucket = match &raw.bucket {
                Some(b) => c.expand(b, &format!("{at}.bucket")),
                None => c.error(f.span(), at, ConfigErrorKind::MissingField { field: "bucket", kind: "a gcs store" }),
            };
            endpoint.zip(bucket).map(|(endpoint, bucket)| FetchStore::Gcs {
                endpoint: endpoint.trim_end_matches('/').to_string(),
                bucket,
            })
        }
        FetchKind::Http => {
            c.stray(&fields, &["prefix", "token"], at, "an http store");
            let prefix = match &raw.prefix {
                Some(p) => http_url(c, p, &format!("{at}.prefix")),
                None => c.error(f.span(), at, ConfigErrorKind::MissingField { field: "prefix", kind: "an http store" }),
            };
            prefix.map(|prefix| FetchStore::Http { prefix })
        }
    };
    let token = match &raw.token {
        Some(t) => reference(c, t, &format!("{at}.token")).map(Some),
        None => Some(None),
    };
    let name =
        |v: &Option<Spanned<String>>, default: &str| v.as_ref().map_or(default.to_string(), |v| v.get_ref().clone());
    let max_mib = c.within(&raw.max_mib, &format!("{at}.max_mib"), 1..=4096).unwrap_or(64);
    let timeout = c.at_most(&raw.timeout, &format!("{at}.timeout"), Duration::from_secs(600));
    Some(FetchConfig {
        store: store?,
        token: token?,
        object_attribute: name(&raw.object_attribute, "objectId"),
        sha256_attribute: name(&raw.sha256_attribute, "sha256"),
        max_bytes: u64::from(max_mib) << 20,
        timeout: timeout.unwrap_or(Duration::from_secs(30)),
        delete_on_purge: raw.delete_on_purge.as_ref().is_some_and(|d| *d.get_ref()),
    })
}

/// What an outbox route must be besides its source: published to Pub/Sub with the
/// aggregate as ordering key, ordered per key, keyed by the aggregate. Its target
/// carries the row id as `outbox_id`; the correlation key is the aggregate, which the
/// source hands over as the message's ordering key.
fn outbox_route(
    c: &mut Checker<'_>,
    r: &RawRoute,
    target: &mut Option<TargetConfig>,
    at: &dyn Fn(&str) -> String,
) -> KeySource {
    let t = r.target.get_ref();
    match target {
        Some(TargetConfig::Pubsub(p)) if p.ordering_key => p.id_attribute = Some("outbox_id".into()),
        Some(TargetConfig::Pubsub(_)) => {
            let span = t.ordering_key.as_ref().map_or(r.target.span(), |o| o.span());
            c.error::<()>(
                span,
                at("target.ordering_key"),
                ConfigErrorKind::Invalid(
                    "an outbox route publishes each aggregate in order: write `ordering_key = true`".into(),
                ),
            );
        }
        Some(_) => {
            c.error::<()>(
                t.kind.span(),
                at("target.kind"),
                ConfigErrorKind::Invalid("an outbox route publishes to Pub/Sub: write `kind = \"pubsub\"`".into()),
            );
        }
        None => {}
    }
    // `ordering` and `correlation_key` carry no span of their own: name the route.
    if r.ordering.is_some_and(|o| o != Ordering::PerKey) {
        c.error::<()>(
            r.name.span(),
            at("ordering"),
            ConfigErrorKind::Invalid("an outbox route is ordered per aggregate: `per-key` (the default)".into()),
        );
    }
    if r.correlation_key.is_some_and(|k| k != KeySource::OrderingKey) {
        c.error::<()>(
            r.name.span(),
            at("correlation_key"),
            ConfigErrorKind::Invalid(
                "an outbox route's correlation key is the row's aggregate; leave `correlation_key` out".into(),
            ),
        );
    }
    KeySource::OrderingKey
}

/// A route's `candidate` or `previous` plugin. Its file is not required to exist
/// here: a candidate that does not load never keeps the route from serving (its
/// shadow says why), and `previous` is read only by a rollback, which checks it.
fn other_plugin(c: &mut Checker<'_>, base: &Path, p: &Spanned<RawPlugin>, field: &str) -> Option<PluginFile> {
    let raw = p.get_ref();
    let written = raw.path(p.span());
    let path_field = if raw.sha256().is_some() { format!("{field}.path") } else { field.to_string() };
    let path = c.expand(&written, &path_field).map(|e| base.join(e));
    let sha256 = match raw.sha256() {
        Some(pin) => Some(plugin_pin(c, pin, &format!("{field}.sha256"))?),
        None => None,
    };
    Some(PluginFile { path: path?, shown: base.join(written.get_ref()), sha256 })
}

/// A pinned plugin digest: 64 hexadecimal digits, kept in lowercase (how
/// `inlet plugin digest` and `/api/routes` write digests).
fn plugin_pin(c: &mut Checker<'_>, pin: &Spanned<String>, field: &str) -> Option<String> {
    let digest = c.expand(pin, field)?;
    if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(digest.to_ascii_lowercase());
    }
    // The file's spelling, not the value: a variable may hold anything.
    let problem = format!(
        "`{}` is not a SHA-256 digest: write the 64 hexadecimal digits `inlet plugin digest FILE` prints",
        pin.get_ref().escape_debug()
    );
    c.error(pin.span(), field, ConfigErrorKind::Invalid(problem))
}

/// `[route.limits]`: each number checked against its range, defaults for the rest.
fn plugin_limits(c: &mut Checker<'_>, l: &RawLimits, at: &dyn Fn(&str) -> String) -> PluginLimits {
    let mut limits = PluginLimits::default();
    let mut within = |value: &Option<Spanned<u32>>, field: &str, range: std::ops::RangeInclusive<u32>| {
        let v = value.as_ref()?;
        if !range.contains(v.get_ref()) {
            let message = format!("must be between {} and {}", range.start(), range.end());
            c.error::<()>(v.span(), at(field), ConfigErrorKind::Invalid(message));
        }
        Some(*v.get_ref() as usize)
    };
    if let Some(mib) = within(&l.memory_mib, "limits.memory_mib", 1..=4096) {
        limits.memory_bytes = mib << 20;
    }
    if let Some(mib) = within(&l.max_output_mib, "limits.max_output_mib", 1..=1024) {
        limits.max_output_bytes = mib << 20;
    }
    if let Some(mib) = within(&l.keep_warm_mib, "limits.keep_warm_mib", 0..=4096) {
        limits.keep_warm_bytes = mib << 20;
    }
    if let Some(n) = within(&l.max_concurrent_calls, "limits.max_concurrent_calls", 1..=1024) {
        limits.max_concurrent_calls = n;
    }
    if let Some(n) = within(&l.timeout_tries, "limits.timeout_tries", 1..=100) {
        limits.timeout_tries = n as u32;
    }
    if let Some(n) = within(&l.max_key_bytes, "limits.max_key_bytes", 1..=1 << 20) {
        limits.max_key_bytes = n;
    }
    if let Some(n) = within(&l.max_label_bytes, "limits.max_label_bytes", 1..=1 << 16) {
        limits.max_label_bytes = n;
    }
    if let Some(n) = within(&l.max_reason_bytes, "limits.max_reason_bytes", 256..=1 << 20) {
        limits.max_reason_bytes = n;
    }
    if let Some(f) = &l.fuel {
        if *f.get_ref() == 0 {
            c.error::<()>(f.span(), at("limits.fuel"), ConfigErrorKind::Invalid("must be at least 1".into()));
        }
        limits.fuel = *f.get_ref();
    }
    if let Some(t) = &l.call_timeout {
        limits.call_timeout = t.get_ref().0;
        if limits.call_timeout < Duration::from_millis(10) {
            c.error::<()>(
                t.span(),
                at("limits.call_timeout"),
                ConfigErrorKind::Invalid("must be at least 10ms".into()),
            );
        }
    }
    limits
}
