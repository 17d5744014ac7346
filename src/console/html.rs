//! HTML for the web console: escaping, the page frame, and the small pieces every page
//! uses (times, ages, payload views, the throughput sparkline).
//!
//! Everything the console shows that came from outside — payloads, keys, attributes,
//! errors, reasons, route and token names — is attacker-controlled, so it reaches the
//! page only through [`esc`] (text and attribute values alike) or [`url_param`] (query
//! strings). Pages are built as strings; no template engine, no script.

use std::fmt::Write as _;

use crate::clock::Millis;

/// `s` safe inside element text and inside a double- or single-quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` as one query-string value (percent-encoded: everything but unreserved bytes).
pub fn url_param(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A query string from the pairs whose value is set: `?route=a&key=b` (or empty).
pub fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| format!("{k}={}", url_param(v))))
        .collect();
    if parts.is_empty() { String::new() } else { format!("?{}", parts.join("&")) }
}

/// The time as `2026-08-01 10:00:00Z`.
pub fn time(ms: Millis) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string().replace('T', " ")
}

/// A duration for people: `42s`, `7m`, `3h 5m`, `2d 4h`.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A state as a coloured label.
pub fn status_badge(status: &str) -> String {
    let class = status.to_ascii_lowercase().replace('_', "-");
    format!(r#"<span class="badge {}">{}</span>"#, esc(&class), esc(status))
}

/// An inline SVG sparkline of `counts` (oldest first), with the total as its title.
pub fn sparkline(counts: &[i64], what: &str) -> String {
    let (w, h) = (180.0_f64, 28.0_f64);
    let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = counts.len().max(2) as f64;
    let points: Vec<String> = counts
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{:.1},{:.1}", i as f64 * w / (n - 1.0), h - 2.0 - (*c as f64 / max) * (h - 4.0)))
        .collect();
    let total: i64 = counts.iter().sum();
    format!(
        r#"<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{t}"><title>{t}</title><polyline fill="none" stroke-width="1.5" points="{p}"/></svg>"#,
        t = esc(&format!("{total} {what}")),
        p = points.join(" ")
    )
}

/// Bytes as a hex dump: offset, 16 bytes in hex, the printable ones as text.
pub fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", i * 16);
        for j in 0..16 {
            match chunk.get(j) {
                Some(b) => {
                    let _ = write!(out, "{b:02x} ");
                }
                None => out.push_str("   "),
            }
        }
        out.push(' ');
        out.extend(chunk.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }));
        out.push('\n');
    }
    out
}

/// The payload views of the entry page: text (lossy UTF-8), JSON pretty-printed (when
/// it parses) and hex, each escaped.
pub fn payload_views(name: &str, bytes: &[u8]) -> String {
    const SHOWN: usize = 256 * 1024;
    let cut = &bytes[..bytes.len().min(SHOWN)];
    let note = if bytes.len() > SHOWN {
        format!(r#"<p class="muted">first {SHOWN} of {} bytes shown</p>"#, bytes.len())
    } else {
        format!(r#"<p class="muted">{} bytes</p>"#, bytes.len())
    };
    let text = String::from_utf8_lossy(cut);
    let json = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .map(|p| format!(r#"<details open><summary>JSON</summary><pre class="payload">{}</pre></details>"#, esc(&p)))
        .unwrap_or_else(|| r#"<p class="muted">not JSON</p>"#.into());
    format!(
        r#"<section class="payload-views"><h3>{name}</h3>{note}{json}<details{open}><summary>Text</summary><pre class="payload">{text}</pre></details><details><summary>Hex</summary><pre class="payload">{hex}</pre></details></section>"#,
        name = esc(name),
        open = if json.starts_with("<details") { "" } else { " open" },
        text = esc(&text),
        hex = esc(&hex_dump(cut)),
    )
}

/// A hidden form field.
pub fn hidden(name: &str, value: &str) -> String {
    format!(r#"<input type="hidden" name="{}" value="{}">"#, esc(name), esc(value))
}

/// Who is signed in, for the page header: the token's name and role, and its CSRF
/// token for the sign-out form.
pub struct SignedIn<'a> {
    pub name: &'a str,
    pub role: &'a str,
    pub csrf: &'a str,
    /// Whether the token may read the audit log (the navigation links it).
    pub audit: bool,
}

/// A whole page: the header with the navigation (when signed in), then `body`.
pub fn page(title: &str, who: Option<&SignedIn<'_>>, notice: Option<&str>, body: &str) -> String {
    let nav = match who {
        Some(v) => format!(
            r#"<nav><a href="/console">Routes</a><a href="/console/failures">Failures</a><a href="/console/entries">Entries</a><a href="/console/repairs">Repair jobs</a>{audit}<span class="who">{name} <span class="muted">({role})</span></span><form method="post" action="/console/logout" class="inline">{csrf}<button type="submit" class="link">Sign out</button></form></nav>"#,
            name = esc(v.name),
            role = esc(v.role),
            csrf = hidden("csrf", v.csrf),
            audit = if v.audit { r#"<a href="/console/audit">Audit log</a>"# } else { "" },
        ),
        None => String::new(),
    };
    let notice = notice.map(|n| format!(r#"<p class="notice">{}</p>"#, esc(n))).unwrap_or_default();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Inlet</title><link rel="stylesheet" href="/console/style.css"></head>
<body><header><span class="brand">Inlet</span>{nav}</header><main><h1>{title}</h1>{notice}{body}</main></body></html>
"#,
        title = esc(title),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_inert() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
        assert_eq!(url_param("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(query(&[("route", Some("a&b")), ("key", None), ("text", Some(""))]), "?route=a%26b");
    }

    #[test]
    fn hex_dump_shows_offsets_and_printable_bytes() {
        let dump = hex_dump(b"hello\x00world, this is seventeen+");
        assert!(dump.starts_with("00000000  68 65 6c 6c 6f 00 77"), "{dump}");
        assert!(dump.contains("hello.world, thi\n00000010"), "{dump}");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(42_000), "42s");
        assert_eq!(age(7 * 60_000 + 5_000), "7m 5s");
        assert_eq!(age(3 * 3_600_000 + 5 * 60_000), "3h 5m");
        assert_eq!(age(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
    }
}
