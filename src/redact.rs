//! Secrets out of output: URLs are shown without their password and query values
//! wherever Inlet prints, logs or stores text that may contain one (`inlet check`,
//! configuration errors). Where a URL's path may be a secret too and the path adds
//! nothing (a transport error stored in `last_error`: a webhook URL such as
//! `/hooks/T000/B000/SECRET`), only its [`origin`] is shown.

/// What replaces a secret.
pub const MASK: &str = "***";

/// `scheme://user:password@host/path?k=v` → `scheme://user:***@host/path?k=***`. A
/// userinfo without a password is masked whole (it is often a token); the fragment
/// is dropped. Text without `://` comes back unchanged.
pub fn url(u: &str) -> String {
    let Some((scheme, rest)) = u.split_once("://") else { return u.to_string() };
    let rest = rest.split('#').next().unwrap_or("");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:{MASK}@{host}"),
            None => format!("{MASK}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => format!("{path}?{}", mask_query(query)),
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// `scheme://user:password@host:port/path?query` → `scheme://host:port`: no userinfo,
/// path, query or fragment. Text without `://` gives [`MASK`], as nothing in it is
/// known not to be secret.
pub fn origin(u: &str) -> String {
    let Some((scheme, rest)) = u.split_once("://") else { return MASK.to_string() };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}")
}

/// A request path with its query values masked: `/hook?token=abc` → `/hook?token=***`.
pub fn path(p: &str) -> String {
    match p.split_once('?') {
        Some((path, query)) => format!("{path}?{}", mask_query(query)),
        None => p.to_string(),
    }
}

fn mask_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) => format!("{k}={MASK}"),
            None if pair.is_empty() => String::new(),
            None => MASK.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Every URL inside free text (an error message) passed through [`url`].
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |p| p + 1);
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '`' | '>' | ','))
            .map_or(rest.len(), |e| i + e);
        out.push_str(&rest[..start]);
        out.push_str(&url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(url("postgres://u:secret@db:5432/inlet"), "postgres://u:***@db:5432/inlet");
        assert_eq!(url("https://tok@h/x"), "https://***@h/x");
        assert_eq!(url("http://h/x?token=secret&a"), "http://h/x?token=***&***");
        assert_eq!(url("http://h:80/x?a=1#frag"), "http://h:80/x?a=***");
        assert_eq!(url("sqlite:///var/lib/inlet.db"), "sqlite:///var/lib/inlet.db");
        assert_eq!(url("no url"), "no url");
    }

    #[test]
    fn origins() {
        assert_eq!(origin("https://hooks.example/hooks/T000/B000/SECRET"), "https://hooks.example");
        assert_eq!(origin("http://u:pw@h:8080/a?token=x#f"), "http://h:8080");
        assert_eq!(origin("http://[::1]:9/x"), "http://[::1]:9");
        assert_eq!(origin("http://h?token=x"), "http://h");
        assert_eq!(origin("no url"), MASK);
    }

    #[test]
    fn text_with_urls() {
        assert_eq!(
            text("error sending request for url (http://h/x?token=secret): refused"),
            "error sending request for url (http://h/x?token=***): refused"
        );
        assert_eq!(text("`postgres://u:pw@h/db` and https://a@b"), "`postgres://u:***@h/db` and https://***@b");
    }
}
