//! The Redis URL and password: parsed once, checked at config load, and turned into the
//! client's connection settings with a password given apart from the URL applied; a
//! server's address and a failure at it as error text.

use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError};

use crate::coordinator::BackendError;

/// Parses a Redis URL the way the client will; the error names the field, shows the
/// URL with any password masked and says what is wrong. `field` goes first.
pub(crate) fn check_parses(field: &str, url: &str) -> Result<(), String> {
    url.into_connection_info().map(|_| ()).map_err(|e| {
        // "what - Kind": the kind adds nothing for a reader.
        let text = e.to_string();
        let what = text.split_once(" - ").map_or(text.as_str(), |(w, _)| w);
        let port = bad_port(url).map_or(String::new(), |p| {
            format!("; the port {p:?} is not a number")
        });
        format!(
            "{field}: not a usable Redis URL: {:?}: {what}{port} (expected \
             redis://[user:password@]host:port[/db] with a numeric port and database)",
            masked(url)
        )
    })
}

/// `url` with the password of its `user:password@` part, if any, replaced by `***`.
fn masked(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// The port of `url` when it is given and is not a number.
fn bad_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    // An IPv6 host is bracketed; its colons are not the port's.
    let after_host = host.rsplit_once(']').map_or(host, |(_, a)| a);
    let port = after_host.rsplit_once(':')?.1;
    (!port.is_empty() && !port.bytes().all(|b| b.is_ascii_digit())).then_some(port)
}

/// The client's connection settings: the URL, with `password` (given apart from the
/// URL, e.g. from an environment variable) taking the place of any password in it.
pub(super) fn connection_info(
    field: &str,
    url: &str,
    password: Option<&str>,
) -> Result<ConnectionInfo, String> {
    check_parses(field, url)?;
    let info = url
        .into_connection_info()
        .map_err(|e| format!("{field}: not a usable Redis URL ({e})"))?;
    Ok(match password {
        Some(pw) => {
            let settings = info.redis_settings().clone().set_password(pw);
            info.set_redis_settings(settings)
        }
        None => info,
    })
}

/// Reads a secret from the environment; the error names `field` and the variable,
/// never a value.
pub(crate) fn read_env(field: &str, var: &str) -> Result<String, String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(format!(
            "{field}: the environment variable {var:?} is empty"
        )),
        Err(std::env::VarError::NotPresent) => Err(format!(
            "{field}: the environment variable {var:?} is not set"
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "{field}: the environment variable {var:?} is not valid UTF-8"
        )),
    }
}

/// `host` and `port` of a TCP address; any other (a socket path) as its text and 0.
pub(super) fn host_port(addr: &ConnectionAddr) -> (String, u16) {
    match addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => (h.clone(), *p),
        other => (other.to_string(), 0),
    }
}

/// A failure as a backend error naming the server (host:port, never the user or
/// password; RedisError's own text holds neither) and, for a timeout, the timeout.
pub(super) fn describe_at(server: &str, timeout: Duration, e: &RedisError) -> BackendError {
    if e.is_timeout() {
        BackendError::new(format!(
            "redis at {server}: no reply within the command timeout ({}): {e}",
            humantime::format_duration(timeout)
        ))
    } else if e.is_connection_refusal() {
        BackendError::new(format!("redis at {server}: cannot connect: {e}"))
    } else {
        BackendError::new(format!("redis at {server}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_shown_with_its_password_masked_and_the_port_named() {
        let Err(e) = check_parses("url", "redis://u:hunter2@127.0.0.1:abc") else {
            panic!("refused");
        };
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("redis://u:***@127.0.0.1:abc"), "{e}");
        assert!(e.contains("the port \"abc\" is not a number"), "{e}");
        assert!(check_parses("url", "redis://127.0.0.1:6379/0").is_ok());
    }
}
