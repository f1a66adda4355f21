//! The file form of the config: each map as a derived struct, and its conversion to
//! the public type.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::duration::{Any, FileDuration, LeaseTtl, TurnWait};
use super::strict::{self, Shape};
use super::value::{Raw, quote, render_seq, visit_all_but_maps, wrong_kind};
use super::{
    CoordinationConfig, CoordinatorConfig, FallbackPolicy, FlowsPolicy, HandoverConfig,
    MemoryOptions, ProviderSession,
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    coordinator: CoordinatorConfig,
    #[serde(
        default,
        alias = "turn_wait_ms",
        alias = "turnWait",
        alias = "turn_wait"
    )]
    turn_wait_ms: FileDuration<TurnWait>,
    #[serde(default, alias = "settle_ms", alias = "settle")]
    settle_ms: FileDuration<Any>,
    #[serde(default, alias = "provider_down_ms", alias = "providerDown")]
    #[serde(alias = "provider_down")]
    provider_down_ms: FileDuration<Any>,
    #[serde(default, alias = "provider_session")]
    provider_session: ProviderSession,
    #[serde(default)]
    handover: HandoverConfig,
}

const CONFIG: Shape = Shape {
    alone: "coordination config",
    expected: r#"a map such as {"coordinator": {"memory": {}}}"#,
    hide: false,
    required: Some((
        "coordinator",
        r#"missing key "coordinator" in coordination config; name the backend, for example "coordinator": {"memory": {}}"#,
    )),
};

impl<'de> Deserialize<'de> for CoordinationConfig {
    /// Reads a coordination config map (see the [module documentation](super)).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let file: FileConfig = strict::read(deserializer, &CONFIG)?;
        let defaults = CoordinationConfig::new(file.coordinator);
        let config = CoordinationConfig {
            turn_wait: file.turn_wait_ms.or(defaults.turn_wait),
            settle: file.settle_ms.or(defaults.settle),
            provider_down: file.provider_down_ms.or(defaults.provider_down),
            provider_session: file.provider_session,
            handover: file.handover,
            ..defaults
        };
        // Every setting was checked as it was read; this guards against the two checks
        // drifting apart.
        config
            .validate()
            .map_err(|e| de::Error::custom(e.message()))?;
        Ok(config)
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct FileMemory {
    #[serde(alias = "lease_ttl_ms", alias = "leaseTtl", alias = "lease_ttl")]
    lease_ttl_ms: FileDuration<LeaseTtl>,
    #[serde(
        alias = "dedup_window_ms",
        alias = "dedupWindow",
        alias = "dedup_window"
    )]
    dedup_window_ms: FileDuration<Any>,
}

const MEMORY: Shape = Shape {
    alone: "memory coordinator options",
    expected: r#"a map of memory coordinator options, such as {} or {"leaseTtl": "10s"}"#,
    hide: false,
    required: None,
};

impl<'de> Deserialize<'de> for MemoryOptions {
    /// Reads an options map such as `{"leaseTtl": "10s"}`; missing options take their
    /// defaults.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let file: FileMemory = strict::read(deserializer, &MEMORY)?;
        let defaults = MemoryOptions::default();
        Ok(MemoryOptions {
            lease_ttl: file.lease_ttl_ms.or(defaults.lease_ttl),
            dedup_window: file.dedup_window_ms.or(defaults.dedup_window),
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct FileHandover {
    flows: FlowsPolicy,
    fallback: FallbackPolicy,
}

const HANDOVER: Shape = Shape {
    alone: "handover config",
    expected: r#"a map such as {"flows": "drop", "fallback": "drop"}"#,
    hide: false,
    required: None,
};

impl<'de> Deserialize<'de> for HandoverConfig {
    /// Reads a map such as `{"flows": "resume", "fallback": "restart"}`; missing keys
    /// take their defaults.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let FileHandover { flows, fallback } = strict::read(deserializer, &HANDOVER)?;
        Ok(HandoverConfig { flows, fallback })
    }
}

const BACKEND_EXPECTED: &str = r#"a map naming one backend, such as {"memory": {}} or {"redis": {"url": "redis://host:6379"}}"#;
#[cfg(feature = "redis")]
const BACKENDS: &str = r#""memory" or "redis""#;
#[cfg(not(feature = "redis"))]
const BACKENDS: &str = r#""memory" (this build lacks the "redis" cargo feature)"#;

impl<'de> Deserialize<'de> for CoordinatorConfig {
    /// Reads a map naming one backend, such as `{"memory": {}}` or
    /// `{"redis": {"url": "redis://host:6379"}}`; errors name the field as
    /// `coordinator`. [`CoordinatorConfig::Shared`] is never produced.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let path = strict::name_or("coordinator");
        deserializer.deserialize_any(Backend { path })
    }
}

/// Reads the coordinator map. It is serde's externally tagged enum form, read by hand
/// for messages that list the backends and never show a URL written in its place.
struct Backend {
    path: String,
}

impl Backend {
    fn refuse<T, E: de::Error>(self, raw: Raw) -> Result<T, E> {
        let path = self.path;
        if let Raw::Str(s) = &raw
            && (s.contains("://") || s.contains('@'))
        {
            return Err(E::custom(format!(
                "{path}: a URL string is not accepted (its text is not shown, as it may hold \
                 a password); expected {BACKEND_EXPECTED}"
            )));
        }
        Err(E::custom(wrong_kind(&path, &raw, BACKEND_EXPECTED, false)))
    }
}

impl<'de> Visitor<'de> for Backend {
    type Value = CoordinatorConfig;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(BACKEND_EXPECTED)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CoordinatorConfig, A::Error> {
        let path = self.path;
        let Some(backend) = map.next_key::<String>()? else {
            let message = format!("{path}: {{}} names no backend; expected {BACKEND_EXPECTED}");
            return Err(de::Error::custom(message));
        };
        let at = format!("{path}.{backend}");
        let config = match backend.as_str() {
            "memory" => CoordinatorConfig::Memory(strict::within(at, || map.next_value())?),
            #[cfg(feature = "redis")]
            "redis" => CoordinatorConfig::Redis(strict::within(at, || map.next_value())?),
            #[cfg(not(feature = "redis"))]
            "redis" => {
                return Err(de::Error::custom(format!(
                    r#"{path}: backend "redis" needs the "redis" cargo feature of botmesh, which this build lacks"#
                )));
            }
            other => {
                return Err(de::Error::custom(format!(
                    "{path}: unknown backend {} (expected {BACKENDS}; a coordinator object \
                     made in code is passed as CoordinatorConfig::Shared)",
                    quote(other)
                )));
            }
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "{path}: {extra:?} given next to {backend:?}; expected exactly one backend"
            )));
        }
        Ok(config)
    }

    visit_all_but_maps!('de, refuse);
}

#[cfg(feature = "redis")]
pub(super) use self::redis::validate_redis;

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::config::ConfigError;
    use crate::config::duration::{CommandTimeout, check_set};
    use crate::config::value;
    use crate::redis::RedisOptions;

    /// Not `Debug`: it holds the URL, which may hold a password.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct FileRedis {
        #[serde(deserialize_with = "url")]
        url: String,
        #[serde(default, alias = "key_prefix", deserialize_with = "key_prefix")]
        key_prefix: Option<String>,
        #[serde(
            default,
            alias = "lease_ttl_ms",
            alias = "leaseTtl",
            alias = "lease_ttl"
        )]
        lease_ttl_ms: FileDuration<LeaseTtl>,
        #[serde(default, alias = "dedup_window_ms", alias = "dedupWindow")]
        #[serde(alias = "dedup_window")]
        dedup_window_ms: FileDuration<Any>,
        #[serde(default, alias = "command_timeout_ms", alias = "commandTimeout")]
        #[serde(alias = "command_timeout")]
        command_timeout_ms: FileDuration<CommandTimeout>,
    }

    const REDIS: Shape = Shape {
        alone: "Redis coordinator options",
        expected: r#"a map of Redis coordinator options, such as {"url": "redis://host:6379"}"#,
        hide: true,
        required: Some((
            "url",
            r#"url: missing; give the Redis server's address, for example "url": "redis://127.0.0.1:6379""#,
        )),
    };

    impl<'de> Deserialize<'de> for RedisOptions {
        /// Reads an options map such as `{"url": "redis://host:6379", "keyPrefix":
        /// "mybot"}` (keys as for `CoordinatorConfig::Redis`); `url` is required, the
        /// other options take their defaults. Errors name the field and never show the
        /// URL.
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let file: FileRedis = strict::read(deserializer, &REDIS)?;
            let mut options = RedisOptions::new(file.url);
            options.key_prefix = file.key_prefix.unwrap_or(options.key_prefix);
            options.lease_ttl = file.lease_ttl_ms.or(options.lease_ttl);
            options.dedup_window = file.dedup_window_ms.or(options.dedup_window);
            options.command_timeout = file.command_timeout_ms.or(options.command_timeout);
            Ok(options)
        }
    }

    const URL_EXPECTED: &str = "a Redis URL string such as \"redis://host:6379\" \
         (schemes redis://, rediss://, redis+unix:// or unix://)";

    fn url<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let name = strict::name_or("url");
        value::scalar(d, |raw| match raw {
            Raw::Str(url) => check_url(&name, &url).map(|()| url),
            raw => Err(wrong_kind(&name, &raw, URL_EXPECTED, true)),
        })
    }

    fn key_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let name = strict::name_or("keyPrefix");
        let expected = r#"a non-empty string without '{' or '}', such as "mybot""#;
        value::scalar(d, |raw| match raw {
            Raw::Str(prefix) => check_key_prefix(&name, &prefix).map(|()| Some(prefix)),
            raw => Err(wrong_kind(&name, &raw, expected, false)),
        })
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
    pub(in crate::config) fn validate_redis(
        o: &RedisOptions,
        prefix: &str,
    ) -> Result<(), ConfigError> {
        check_url(&format!("{prefix}url"), &o.url).map_err(ConfigError::new)?;
        check_key_prefix(&format!("{prefix}keyPrefix"), &o.key_prefix).map_err(ConfigError::new)?;
        check_set::<LeaseTtl>(&format!("{prefix}leaseTtlMs"), o.lease_ttl)?;
        check_set::<Any>(&format!("{prefix}dedupWindowMs"), o.dedup_window)?;
        check_set::<CommandTimeout>(&format!("{prefix}commandTimeoutMs"), o.command_timeout)
    }
}
