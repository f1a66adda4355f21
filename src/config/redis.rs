//! The Redis coordinator's options in files, and the checks of a URL and key prefix
//! (also for options set in code).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::duration::{Any, CommandTimeout, FileDuration, LeaseTtl, check_set};
use super::error::ConfigError;
use super::strict::{self, Shape};
use super::value::{self, Raw, Scalar};
use crate::redis::RedisOptions;

/// Not `Debug`: it holds the URL, which may hold a password.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileRedis {
    #[serde(default, deserialize_with = "url")]
    url: Option<String>,
    #[serde(default, alias = "key_prefix", deserialize_with = "key_prefix")]
    key_prefix: Option<String>,
    #[serde(default, alias = "lease_ttl_ms", alias = "leaseTtl")]
    #[serde(alias = "lease_ttl")]
    lease_ttl_ms: FileDuration<LeaseTtl>,
    #[serde(default, alias = "dedup_window_ms", alias = "dedupWindow")]
    #[serde(alias = "dedup_window")]
    dedup_window_ms: FileDuration<Any>,
    #[serde(
        default,
        alias = "dedup_ids",
        deserialize_with = "super::count::dedup_ids"
    )]
    dedup_ids: Option<usize>,
    #[serde(
        default,
        alias = "wait_replicas",
        deserialize_with = "super::count::wait_replicas"
    )]
    wait_replicas: Option<usize>,
    #[serde(default, alias = "command_timeout_ms", alias = "commandTimeout")]
    #[serde(alias = "command_timeout")]
    command_timeout_ms: FileDuration<CommandTimeout>,
    /// The name of an environment variable holding the URL (instead of `url`), so the
    /// password stays out of the file.
    #[serde(default, alias = "url_env", deserialize_with = "env_name")]
    url_env: Option<String>,
    /// The name of an environment variable holding the password; it takes the place
    /// of any password in the URL.
    #[serde(default, alias = "password_env", deserialize_with = "env_name")]
    password_env: Option<String>,
    /// Redis Cluster seed nodes, instead of `url`.
    #[serde(default, deserialize_with = "seed_list")]
    cluster: Option<Vec<String>>,
    /// Sentinels and the service they monitor, instead of `url`.
    #[serde(default, deserialize_with = "sentinel")]
    sentinel: Option<FileSentinel>,
    /// TLS files for `rediss://`.
    #[serde(default)]
    tls: Option<FileTls>,
}

/// `{"urls": ["redis://…:26379", …], "service": "mymaster"}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileSentinel {
    urls: Vec<String>,
    service: String,
}

/// `{"caFile": "…", "clientCert": "…", "clientKey": "…"}`, each optional.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileTls {
    #[serde(default, alias = "ca_file")]
    ca_file: Option<std::path::PathBuf>,
    #[serde(default, alias = "client_cert")]
    client_cert: Option<std::path::PathBuf>,
    #[serde(default, alias = "client_key")]
    client_key: Option<std::path::PathBuf>,
}

const REDIS: Shape = Shape {
    alone: "Redis coordinator options",
    expected: r#"a map of Redis coordinator options, such as {"url": "redis://host:6379"}"#,
    hide: true,
    // `url` or `urlEnv`: checked after reading.
    required: None,
};

/// The message when neither `url` nor `urlEnv` is given (after the map's prefix).
const URL_MISSING: &str = r#"url: missing; give the Redis server's address, for example "url": "redis://127.0.0.1:6379", the name of an environment variable holding it, "urlEnv": "BOTMESH_REDIS_URL", Redis Cluster seed nodes, "cluster": ["redis://127.0.0.1:7000"], or sentinels, "sentinel": {"urls": ["redis://127.0.0.1:26379"], "service": "mymaster"}"#;

impl<'de> Deserialize<'de> for RedisOptions {
    /// Reads an options map such as `{"url": "redis://host:6379", "keyPrefix":
    /// "mybot"}` (keys as for `CoordinatorConfig::Redis`); `url` is required, the
    /// other options take their defaults. Errors name the field and never show the
    /// URL.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let here = strict::name_or("");
        let prefix = if here.is_empty() { here } else { here + "." };
        let file: FileRedis = strict::read(deserializer, &REDIS)?;
        let fail = |e: String| D::Error::custom(format!("{prefix}{e}"));
        let url = match (file.url, file.url_env) {
            (Some(url), None) => url,
            (None, Some(var)) => {
                // The value is checked as `url` would be, named after `urlEnv`.
                let url = crate::redis::read_env("urlEnv", &var).map_err(fail)?;
                check_url("urlEnv", &url)
                    .and_then(|()| crate::redis::check_parses(&format!("urlEnv ({var:?})"), &url))
                    .map_err(fail)?;
                url
            }
            (Some(_), Some(_)) => {
                return Err(fail(
                    "url, urlEnv: both given; give the URL in one of them".to_owned(),
                ));
            }
            (None, None) if file.cluster.is_some() || file.sentinel.is_some() => String::new(),
            (None, None) => return Err(fail(URL_MISSING.to_owned())),
        };
        let mut options = RedisOptions::new(url);
        if let Some(nodes) = file.cluster {
            if nodes.is_empty() {
                return Err(fail(
                    "cluster: the list of seed nodes is empty; give at least one, such as \
                     [\"redis://127.0.0.1:7000\"]"
                        .to_owned(),
                ));
            }
            for (i, url) in nodes.iter().enumerate() {
                check_url(&format!("cluster[{i}]"), url).map_err(fail)?;
            }
            options.cluster = nodes;
        }
        if let Some(s) = file.sentinel {
            for (i, url) in s.urls.iter().enumerate() {
                check_url(&format!("sentinel.urls[{i}]"), url).map_err(fail)?;
            }
            options.sentinel = Some(crate::redis::SentinelOptions {
                urls: s.urls,
                service: s.service,
            });
        }
        if let Some(t) = file.tls {
            options.tls = crate::redis::TlsOptions {
                ca_file: t.ca_file,
                client_cert: t.client_cert,
                client_key: t.client_key,
            };
        }
        crate::redis::check_mode(&options).map_err(fail)?;
        if let Some(var) = file.password_env {
            options = options.with_password_from_env(&var).map_err(fail)?;
        }
        options.key_prefix = file.key_prefix.unwrap_or(options.key_prefix);
        let ttl = file.lease_ttl_ms.or(options.lease_ttl);
        options = options.with_lease_ttl(ttl);
        options.dedup_window = file.dedup_window_ms.or(options.dedup_window);
        options.dedup_ids = file.dedup_ids.unwrap_or(options.dedup_ids);
        options.wait_replicas = file.wait_replicas.unwrap_or(options.wait_replicas);
        options.command_timeout = file.command_timeout_ms.or(options.command_timeout);
        Ok(options)
    }
}

const URL_EXPECTED: &str = "a Redis URL string such as \"redis://host:6379\" \
     (schemes redis://, rediss://, redis+unix:// or unix://)";

fn url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = strict::name_or("url");
    value::read(
        d,
        Scalar(URL_EXPECTED, |raw| match raw {
            Raw::Str(url) => check_url(&name, &url)
                .and_then(|()| crate::redis::check_parses(&name, &url))
                .map(|()| Some(url)),
            raw => Err(raw.wrong(&name, URL_EXPECTED, true)),
        }),
    )
}

/// `cluster`: a list of URL strings. serde's own message for another shape names no
/// field and quotes the value (a URL may hold a password): neither here.
fn seed_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let name = strict::name_or("cluster");
    Vec::<String>::deserialize(d).map(Some).map_err(|_| {
        D::Error::custom(format!(
            "{name}: expected a list of seed node URLs (strings), such as \
             [\"redis://10.0.0.5:7000\", \"redis://10.0.0.6:7001\"] (the value is not shown, \
             as it may hold a password)"
        ))
    })
}

/// `sentinel`: `{"urls": [...], "service": "..."}`, with the field named in every
/// message (serde's say only "missing field `service`"), and no value quoted.
fn sentinel<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FileSentinel>, D::Error> {
    let name = strict::name_or("sentinel");
    FileSentinel::deserialize(d).map(Some).map_err(|e| {
        let text = e.to_string();
        let known = ["missing field", "unknown field", "duplicate field"]
            .iter()
            .any(|k| text.starts_with(k));
        let why = if known {
            format!("{}; ", text.split(" at line").next().unwrap_or(&text))
        } else {
            String::new()
        };
        D::Error::custom(format!(
            "{name}: {why}expected {{\"urls\": [\"redis://10.0.0.7:26379\", …], \"service\": \
             \"mymaster\"}} (a value is not shown, as it may hold a password)"
        ))
    })
}

fn env_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = strict::name_or("urlEnv");
    let expected = r#"the name of an environment variable, such as "BOTMESH_REDIS_URL""#;
    value::read(
        d,
        Scalar(expected, |raw| match raw {
            Raw::Str(var) if !var.is_empty() && !var.contains(['=', '\0']) => Ok(Some(var)),
            raw => Err(raw.wrong(&name, expected, false)),
        }),
    )
}

fn key_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = strict::name_or("keyPrefix");
    let expected = r#"a non-empty string without '{' or '}', such as "mybot""#;
    value::read(
        d,
        Scalar(expected, |raw| match raw {
            Raw::Str(prefix) => check_key_prefix(&name, &prefix).map(|()| Some(prefix)),
            raw => Err(raw.wrong(&name, expected, false)),
        }),
    )
}

/// Checks a Redis URL's scheme (without regard to case). The message names the
/// field but never shows the URL.
fn check_url(name: &str, url: &str) -> Result<(), String> {
    if url.trim().is_empty() {
        return Err(format!("{name}: the URL is empty; expected {URL_EXPECTED}"));
    }
    let schemes = ["redis://", "rediss://", "redis+unix://", "unix://"];
    let known = schemes.iter().any(|scheme| {
        url.len() > scheme.len()
            && url
                .get(..scheme.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
    });
    if known {
        return Ok(());
    }
    Err(format!(
        "{name}: not a Redis URL (expected redis://host:port, rediss://host:port, \
         redis+unix:///path or unix:///path; the value is not shown, as it may hold \
         a password)"
    ))
}

/// Checks a Redis key prefix. Braces would change the Redis Cluster hash slot of a
/// chat's keys.
fn check_key_prefix(name: &str, prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err(format!(
            "{name}: \"\" is empty; give a prefix such as \"mybot\" (the default is \"botmesh\")"
        ));
    }
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "{name}: {prefix:?} contains a brace; '{{' and '}}' are not allowed because \
             they would change the Redis Cluster hash slot of a chat's keys"
        ));
    }
    Ok(())
}

/// Checks Redis options set in code; `prefix` goes before each field name.
pub(super) fn validate(o: &RedisOptions, prefix: &str) -> Result<(), ConfigError> {
    // An empty URL with no cluster or sentinel either: `check_mode` says what is
    // missing (one of the three).
    if !o.url.is_empty() {
        check_url(&format!("{prefix}url"), &o.url).map_err(ConfigError::new)?;
    }
    for (i, url) in o.cluster.iter().enumerate() {
        check_url(&format!("{prefix}cluster[{i}]"), url).map_err(ConfigError::new)?;
    }
    crate::redis::check_mode(o).map_err(|e| ConfigError::new(format!("{prefix}{e}")))?;
    check_key_prefix(&format!("{prefix}keyPrefix"), &o.key_prefix).map_err(ConfigError::new)?;
    check_set::<LeaseTtl>(&format!("{prefix}leaseTtlMs"), o.lease_ttl)?;
    check_set::<Any>(&format!("{prefix}dedupWindowMs"), o.dedup_window)?;
    crate::coordinator::check_dedup_ids(&format!("{prefix}dedupIds"), o.dedup_ids)
        .map_err(ConfigError::new)?;
    crate::redis::check_wait_replicas(&format!("{prefix}waitReplicas"), o.wait_replicas)
        .map_err(ConfigError::new)?;
    check_set::<CommandTimeout>(&format!("{prefix}commandTimeoutMs"), o.command_timeout)?;
    crate::redis::check_timeout_fits_lease(o).map_err(|e| ConfigError::new(format!("{prefix}{e}")))
}
