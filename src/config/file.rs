//! The file form of the config: each map as a derived struct, and its conversion to
//! the public type.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess};

use super::duration::{Any, FileDuration, LeaseTtl, TurnWait};
use super::settings::{
    CoordinationConfig, CoordinatorConfig, FallbackPolicy, FlowsPolicy, HandoverConfig,
    MemoryOptions, ProviderSession,
};
use super::strict::{self, Shape};
use super::value::{self, Raw, Read, quote};

// The file structs are read through `strict::read`, which needs `deny_unknown_fields`.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    coordinator: CoordinatorConfig,
    #[serde(default, alias = "turn_wait_ms", alias = "turnWait")]
    #[serde(alias = "turn_wait")]
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
    #[serde(default, alias = "clock_drift_ms", alias = "clockDrift")]
    #[serde(alias = "clock_drift")]
    clock_drift_ms: FileDuration<Any>,
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
    /// Reads a coordination config map (see [`CoordinationConfig`]).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let file: FileConfig = strict::read(deserializer, &CONFIG)?;
        let defaults = CoordinationConfig::new(file.coordinator);
        let config = CoordinationConfig {
            turn_wait: file.turn_wait_ms.or(defaults.turn_wait),
            settle: file.settle_ms.or(defaults.settle),
            provider_down: file.provider_down_ms.or(defaults.provider_down),
            provider_session: file.provider_session,
            handover: file.handover,
            clock_drift: file.clock_drift_ms.given(),
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
    #[serde(alias = "dedup_window_ms", alias = "dedupWindow")]
    #[serde(alias = "dedup_window")]
    dedup_window_ms: FileDuration<Any>,
    #[serde(alias = "dedup_ids", deserialize_with = "super::count::dedup_ids")]
    dedup_ids: Option<usize>,
    #[serde(
        alias = "chat_capacity",
        deserialize_with = "super::count::chat_capacity"
    )]
    chat_capacity: Option<usize>,
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
            dedup_ids: file.dedup_ids.unwrap_or(defaults.dedup_ids),
            chat_capacity: file.chat_capacity.unwrap_or(defaults.chat_capacity),
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
#[cfg(not(feature = "redis"))]
const NO_REDIS: &str =
    r#"backend "redis" needs the "redis" cargo feature of botmesh, which this build lacks"#;

impl<'de> Deserialize<'de> for CoordinatorConfig {
    /// Reads a map naming one backend, such as `{"memory": {}}` or
    /// `{"redis": {"url": "redis://host:6379"}}`; errors name the field as
    /// `coordinator`. [`CoordinatorConfig::Shared`] is never produced.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        value::read(deserializer, Backend(strict::name_or("coordinator")))
    }
}

/// Reads the coordinator map, serde's externally tagged enum form, by hand: for
/// messages that list the backends and never show a URL written in its place.
struct Backend(String);

impl<'de> Read<'de> for Backend {
    type Value = CoordinatorConfig;

    fn expected(&self) -> &str {
        BACKEND_EXPECTED
    }

    fn other(self, raw: Raw) -> Result<CoordinatorConfig, String> {
        match &raw {
            Raw::Str(s) if s.contains("://") || s.contains('@') => Err(format!(
                "{}: a URL string is not accepted (its text is not shown, as it may hold a \
                 password); expected {BACKEND_EXPECTED}",
                self.0
            )),
            _ => Err(raw.wrong(&self.0, BACKEND_EXPECTED, false)),
        }
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<CoordinatorConfig, A::Error> {
        let path = self.0;
        let refuse = |message: String| Err(de::Error::custom(format!("{path}: {message}")));
        let Some(backend) = map.next_key::<String>()? else {
            return refuse(format!(
                "{{}} names no backend; expected {BACKEND_EXPECTED}"
            ));
        };
        let at = format!("{path}.{backend}");
        let config = match backend.as_str() {
            "memory" => CoordinatorConfig::Memory(strict::within(at, || map.next_value())?),
            #[cfg(feature = "redis")]
            "redis" => CoordinatorConfig::Redis(strict::within(at, || map.next_value())?),
            #[cfg(not(feature = "redis"))]
            "redis" => return refuse(NO_REDIS.to_owned()),
            other => {
                return refuse(format!(
                    "unknown backend {} (expected {BACKENDS}; a coordinator object made in \
                     code is passed as CoordinatorConfig::Shared)",
                    quote(other)
                ));
            }
        };
        match map.next_key::<String>()? {
            Some(extra) => refuse(format!(
                "{extra:?} given next to {backend:?}; expected exactly one backend"
            )),
            None => Ok(config),
        }
    }
}
