//! `etcd://host:port[,host:port]/RUN_ID?option=value&...` parsing.
//!
//! Schemes: `etcd` and `etcd-v3` talk plain HTTP/2; `etcds` and `etcd+https` talk TLS (the same
//! as `protocol=https`). The path is the run id, percent-decoded; the query carries options with
//! the names `Params::set` accepts. Credentials are options, never part of the authority, so a
//! URL can be logged after redacting its query.

use super::{parse_endpoints, shown, Params};
use crate::error::{Error, Result};

const PLAIN_SCHEMES: &[&str] = &["etcd", "etcd-v3"];
const TLS_SCHEMES: &[&str] = &["etcds", "etcd+https"];

pub(super) fn parse(url: &str) -> Result<Params> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        Error::invalid(format!(
            "url: expected etcd://host:port/RUN_ID?options, got {}",
            shown(&redact(url))
        ))
    })?;
    let https = if PLAIN_SCHEMES.contains(&scheme) {
        false
    } else if TLS_SCHEMES.contains(&scheme) {
        true
    } else {
        return Err(Error::invalid(format!(
            "url: scheme must be one of etcd, etcd-v3, etcds, etcd+https; got {}",
            shown(scheme)
        )));
    };
    let (location, query) = match rest.split_once('?') {
        Some((l, q)) => (l, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = location.split_once('/').ok_or_else(|| {
        Error::invalid("url: expected a run id after the endpoints, as in etcd://host:2379/RUN_ID")
    })?;
    if authority.contains('@') {
        return Err(Error::invalid(
            "url: credentials in the authority are not accepted; use the username and password options",
        ));
    }
    let run_id = percent_decode("run id", path)?;
    let mut params = Params::unchecked("etcd-v3", &run_id);
    params.endpoints = parse_endpoints(authority)?;
    params.security.https = https;
    // Options apply in order; node counts are checked only once all are in.
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                Error::invalid(format!(
                    "url: option {} has no value; expected name=value",
                    shown(pair)
                ))
            })?;
            let name = percent_decode("option name", name)?;
            let value = percent_decode(&name, value)?;
            params.apply(&name, &value)?;
            if name == "protocol" && https && !params.security.https {
                return Err(Error::invalid(format!(
                    "url: scheme {scheme:?} means TLS, but the option protocol=http says plain HTTP; drop one of them"
                )));
            }
        }
    }
    params.validate()?;
    Ok(params)
}

/// Decodes `%XX` escapes and `+` as space, failing on bad escapes or invalid UTF-8.
pub(crate) fn percent_decode(what: &str, text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "url: {what}: bad percent escape in {}",
                            shown(text)
                        ))
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::invalid(format!("url: {what}: not valid UTF-8 after decoding")))
}

/// The URL without its query, which may hold a password.
fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((head, _)) => format!("{head}?…"),
        None => url.to_string(),
    }
}
