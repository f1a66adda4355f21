//! The Redis URL and password: parsed once, checked at config load, and turned into the
//! client's connection settings with a password given apart from the URL applied.

use redis::{ConnectionInfo, IntoConnectionInfo};

/// Parses a Redis URL the way the client will; the error names the field and what is
/// wrong, never the URL (it may hold a password). `field` goes first in the text.
pub(crate) fn check_parses(field: &str, url: &str) -> Result<(), String> {
    url.into_connection_info().map(|_| ()).map_err(|e| {
        format!(
            "{field}: not a usable Redis URL: {} (expected redis://[user:password@]host:port[/db] \
             with a numeric port and database; the value is not shown, as it may hold a password)",
            // "what - Kind": the kind adds nothing for a reader.
            match e.to_string().split_once(" - ") {
                Some((what, _)) => what.to_owned(),
                None => e.to_string(),
            }
        )
    })
}

/// The client's connection settings: the URL, with `password` (given apart from the
/// URL, e.g. from an environment variable) taking the place of any password in it.
pub(super) fn connection_info(url: &str, password: Option<&str>) -> Result<ConnectionInfo, String> {
    check_parses("url", url)?;
    let info = url
        .into_connection_info()
        .map_err(|e| format!("url: not a usable Redis URL ({e})"))?;
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
