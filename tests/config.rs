//! Loading and checking `CoordinationConfig`: spellings, durations, defaults, and the
//! error messages for bad input, in JSON and TOML.

use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    BackendError, EnqueueRequest, Enqueued, Grant, GrantSink, HeldLease, Released, ReplicaId,
    Waiting,
};
use botmesh::{
    ConfigError, CoordinationConfig, Coordinator, CoordinatorConfig, FallbackPolicy, FlowsPolicy,
    HandoverConfig, MemoryCoordinator, MemoryOptions, ProviderSession,
};

// ----- helpers

fn json(text: &str) -> CoordinationConfig {
    match CoordinationConfig::from_json_str(text) {
        Ok(config) => config,
        Err(e) => panic!("{text} should load, got: {e}"),
    }
}

fn toml_ok(text: &str) -> CoordinationConfig {
    match toml::from_str::<CoordinationConfig>(text) {
        Ok(config) => config,
        Err(e) => panic!("{text} should load, got: {e}"),
    }
}

/// Loads JSON that must fail, and checks that the message names every `needle`.
fn json_err(text: &str, needles: &[&str]) -> String {
    let err: ConfigError = match CoordinationConfig::from_json_str(text) {
        Ok(config) => panic!("{text} should be refused, got {config:?}"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        message.starts_with("invalid config: "),
        "unexpected prefix: {message}"
    );
    for needle in needles {
        assert!(
            message.contains(needle),
            "error for {text} should contain {needle:?}: {message}"
        );
    }
    message
}

/// Loads TOML that must fail, and checks that the message names every `needle`.
fn toml_err(text: &str, needles: &[&str]) -> String {
    let message = match toml::from_str::<CoordinationConfig>(text) {
        Ok(config) => panic!("{text} should be refused, got {config:?}"),
        Err(e) => e.to_string(),
    };
    for needle in needles {
        assert!(
            message.contains(needle),
            "error for {text} should contain {needle:?}: {message}"
        );
    }
    message
}

fn memory(config: &CoordinationConfig) -> MemoryOptions {
    match &config.coordinator {
        CoordinatorConfig::Memory(options) => *options,
        other => panic!("expected a memory coordinator, got {other:?}"),
    }
}

const MEMORY: &str = r#""coordinator": {"memory": {}}"#;

fn with_memory(rest: &str) -> String {
    format!("{{{MEMORY}, {rest}}}")
}

// ----- defaults and building in code

#[test]
fn defaults() {
    let config = CoordinationConfig::new(CoordinatorConfig::memory());
    assert_eq!(config.turn_wait, Duration::from_secs(120));
    assert_eq!(config.settle, Duration::from_secs(60));
    assert_eq!(config.provider_down, Duration::from_secs(60));
    assert_eq!(config.provider_session, ProviderSession::Auto);
    assert_eq!(
        config.handover,
        HandoverConfig {
            flows: FlowsPolicy::Drop,
            fallback: FallbackPolicy::Drop
        }
    );
    assert_eq!(config.handover, HandoverConfig::default());
    let options = memory(&config);
    assert_eq!(options, MemoryOptions::default());
    assert_eq!(options.lease_ttl, Duration::from_secs(10));
    assert_eq!(options.dedup_window, Duration::from_secs(600));
    assert_eq!(ProviderSession::default(), ProviderSession::Auto);
    assert_eq!(FlowsPolicy::default(), FlowsPolicy::Drop);
    assert_eq!(FallbackPolicy::default(), FallbackPolicy::Drop);
    assert!(config.validate().is_ok());
}

#[test]
fn minimal_file_takes_every_default() {
    for config in [
        json(r#"{"coordinator": {"memory": {}}}"#),
        toml_ok("[coordinator.memory]\n"),
    ] {
        let defaults = CoordinationConfig::new(CoordinatorConfig::memory());
        assert_eq!(config.turn_wait, defaults.turn_wait);
        assert_eq!(config.settle, defaults.settle);
        assert_eq!(config.provider_down, defaults.provider_down);
        assert_eq!(config.provider_session, defaults.provider_session);
        assert_eq!(config.handover, defaults.handover);
        assert_eq!(memory(&config), MemoryOptions::default());
    }
}

#[test]
fn builder_setters() {
    let config = CoordinationConfig::new(CoordinatorConfig::Memory(
        MemoryOptions::default()
            .with_lease_ttl(Duration::from_secs(3))
            .with_dedup_window(Duration::ZERO),
    ))
    .with_turn_wait(Duration::from_secs(5))
    .with_settle(Duration::ZERO)
    .with_provider_down(Duration::from_secs(7))
    .with_provider_session(ProviderSession::Shared)
    .with_handover(HandoverConfig {
        flows: FlowsPolicy::Resume,
        fallback: FallbackPolicy::Restart,
    });
    assert_eq!(config.turn_wait, Duration::from_secs(5));
    assert_eq!(config.settle, Duration::ZERO);
    assert_eq!(config.provider_down, Duration::from_secs(7));
    assert_eq!(config.provider_session, ProviderSession::Shared);
    assert_eq!(config.handover.flows, FlowsPolicy::Resume);
    assert_eq!(config.handover.fallback, FallbackPolicy::Restart);
    assert_eq!(memory(&config).lease_ttl, Duration::from_secs(3));
    assert_eq!(memory(&config).dedup_window, Duration::ZERO);
    assert!(config.validate().is_ok());
}

#[test]
fn validate_refuses_bad_values_set_in_code() {
    let base = CoordinationConfig::new(CoordinatorConfig::memory());

    let err = base.clone().with_turn_wait(Duration::ZERO).validate();
    let message = err.expect_err("zero turn wait").to_string();
    assert!(
        message.contains("turnWaitMs") && message.contains("0s"),
        "{message}"
    );

    let err = base
        .clone()
        .with_settle(Duration::from_millis(2_147_483_648))
        .validate();
    let message = err.expect_err("settle over the maximum").to_string();
    assert!(
        message.contains("settleMs") && message.contains("too large"),
        "{message}"
    );

    let err = base
        .with_coordinator(CoordinatorConfig::Memory(
            MemoryOptions::default().with_lease_ttl(Duration::from_millis(5)),
        ))
        .validate();
    let message = err.expect_err("lease TTL too short").to_string();
    assert!(
        message.contains("coordinator.memory.leaseTtlMs") && message.contains("5ms"),
        "{message}"
    );

    // The largest accepted value is accepted.
    let max = CoordinationConfig::new(CoordinatorConfig::memory())
        .with_provider_down(CoordinationConfig::MAX_DURATION);
    assert!(max.validate().is_ok());
    assert_eq!(
        CoordinationConfig::MAX_DURATION,
        Duration::from_millis(2_147_483_647)
    );
}

// ----- a coordinator made in code

struct NamedBackend;

impl Coordinator for NamedBackend {
    fn backend(&self) -> &'static str {
        "test-backend"
    }
    fn lease_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn attach(&self, _: &ReplicaId, _: GrantSink) -> Result<(), BackendError> {
        Err(BackendError::new("not used"))
    }
    fn detach(&self, _: &ReplicaId, _: &[HeldLease<'_>]) -> Result<(), BackendError> {
        Err(BackendError::new("not used"))
    }
    fn enqueue(&self, _: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        Err(BackendError::new("not used"))
    }
    fn cancel(&self, _: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        Err(BackendError::new("not used"))
    }
    fn release(&self, _: &HeldLease<'_>, _: Option<&str>) -> Result<Released, BackendError> {
        Err(BackendError::new("not used"))
    }
    fn renew(
        &self,
        _: &ReplicaId,
        _: &[HeldLease<'_>],
        _: &[Waiting<'_>],
    ) -> Result<botmesh::Renewal, BackendError> {
        Err(BackendError::new("not used"))
    }
    fn write_checkpoint(&self, _: &str, _: u64, _: Option<&str>) -> Result<bool, BackendError> {
        Err(BackendError::new("not used"))
    }
    fn read_checkpoint(&self, _: &str) -> Result<Option<(u64, String)>, BackendError> {
        Err(BackendError::new("not used"))
    }
}

#[test]
fn shared_coordinator_is_cloned_by_reference_and_debugs_its_name() {
    let backend: Arc<dyn Coordinator> = Arc::new(NamedBackend);
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(backend.clone()));
    let copy = config.clone();
    match (&config.coordinator, &copy.coordinator) {
        (CoordinatorConfig::Shared(a), CoordinatorConfig::Shared(b)) => {
            assert!(Arc::ptr_eq(a, b));
            assert!(Arc::ptr_eq(a, &backend));
        }
        other => panic!("expected shared coordinators, got {other:?}"),
    }
    assert_eq!(
        format!("{:?}", config.coordinator),
        r#"Shared("test-backend")"#
    );
    assert_eq!(config.coordinator.backend(), "test-backend");
    assert_eq!(CoordinatorConfig::memory().backend(), "memory");
    assert!(config.validate().is_ok());
    assert_eq!(
        format!("{:?}", CoordinatorConfig::from(backend)),
        r#"Shared("test-backend")"#
    );
}

// ----- spellings

fn assert_full(config: &CoordinationConfig) {
    assert_eq!(config.turn_wait, Duration::from_secs(30));
    assert_eq!(config.settle, Duration::from_millis(1500));
    assert_eq!(config.provider_down, Duration::from_secs(90 * 60));
    assert_eq!(config.provider_session, ProviderSession::Leader);
    assert_eq!(config.handover.flows, FlowsPolicy::Resume);
    assert_eq!(config.handover.fallback, FallbackPolicy::Restart);
    assert_eq!(memory(config).lease_ttl, Duration::from_secs(5));
    assert_eq!(memory(config).dedup_window, Duration::from_secs(60));
}

#[test]
fn camel_case_json() {
    let config = json(
        r#"{
            "coordinator": {"memory": {"leaseTtlMs": 5000, "dedupWindowMs": "1m"}},
            "turnWaitMs": 30000,
            "settleMs": "1500ms",
            "providerDownMs": "1h 30m",
            "providerSession": "leader",
            "handover": {"flows": "resume", "fallback": "restart"}
        }"#,
    );
    assert_full(&config);
}

#[test]
fn snake_case_json() {
    let config = json(
        r#"{
            "coordinator": {"memory": {"lease_ttl_ms": "5s", "dedup_window_ms": 60000}},
            "turn_wait_ms": "30s",
            "settle_ms": 1500,
            "provider_down_ms": 5400000,
            "provider_session": "leader",
            "handover": {"flows": "resume", "fallback": "restart"}
        }"#,
    );
    assert_full(&config);
}

#[test]
fn short_names_json() {
    let config = json(
        r#"{
            "coordinator": {"memory": {"leaseTtl": "5s", "dedupWindow": "1m"}},
            "turnWait": "30s",
            "settle": "1500ms",
            "providerDown": "90m",
            "providerSession": "leader",
            "handover": {"flows": "resume", "fallback": "restart"}
        }"#,
    );
    assert_full(&config);
    let config = json(
        r#"{
            "coordinator": {"memory": {"lease_ttl": "5s", "dedup_window": "1m"}},
            "turn_wait": "30s",
            "settle": 1500,
            "provider_down": "90m",
            "provider_session": "leader",
            "handover": {"flows": "resume", "fallback": "restart"}
        }"#,
    );
    assert_full(&config);
}

#[test]
fn camel_case_toml() {
    let config = toml_ok(
        r#"
turnWaitMs = 30000
settleMs = "1500ms"
providerDownMs = "1h 30m"
providerSession = "leader"

[coordinator.memory]
leaseTtlMs = 5000
dedupWindowMs = "1m"

[handover]
flows = "resume"
fallback = "restart"
"#,
    );
    assert_full(&config);
}

#[test]
fn snake_case_toml() {
    let config = toml_ok(
        r#"
turn_wait_ms = "30s"
settle_ms = 1500
provider_down_ms = 5400000
provider_session = "leader"
coordinator = { memory = { lease_ttl_ms = "5s", dedup_window_ms = 60000 } }
handover = { flows = "resume", fallback = "restart" }
"#,
    );
    assert_full(&config);
}

// ----- durations

#[test]
fn humantime_strings_and_millisecond_numbers() {
    let cases: &[(&str, Duration)] = &[
        (r#""2m""#, Duration::from_secs(120)),
        (r#""1500ms""#, Duration::from_millis(1500)),
        (r#""1h 30m""#, Duration::from_secs(5400)),
        (r#""10s""#, Duration::from_secs(10)),
        (r#"" 3s ""#, Duration::from_secs(3)),
        ("1", Duration::from_millis(1)),
        ("1500", Duration::from_millis(1500)),
        ("120000", Duration::from_secs(120)),
        ("2147483647", Duration::from_millis(2_147_483_647)),
        (r#""2147483647ms""#, Duration::from_millis(2_147_483_647)),
    ];
    for (value, expected) in cases {
        let config = json(&with_memory(&format!(r#""turnWaitMs": {value}"#)));
        assert_eq!(config.turn_wait, *expected, "JSON {value}");
        let config = toml_ok(&format!("turnWaitMs = {value}\n[coordinator.memory]\n"));
        assert_eq!(config.turn_wait, *expected, "TOML {value}");
    }
}

#[test]
fn whole_float_is_milliseconds() {
    let config = json(&with_memory(r#""settleMs": 2000.0"#));
    assert_eq!(config.settle, Duration::from_secs(2));
}

#[test]
fn zero_is_allowed_where_it_means_something() {
    let config = json(
        r#"{"coordinator": {"memory": {"dedupWindow": 0}}, "settle": 0, "providerDown": "0s"}"#,
    );
    assert_eq!(config.settle, Duration::ZERO);
    assert_eq!(config.provider_down, Duration::ZERO);
    assert_eq!(memory(&config).dedup_window, Duration::ZERO);
}

#[test]
fn smallest_lease_ttl_is_accepted() {
    let config = json(r#"{"coordinator": {"memory": {"leaseTtl": "10ms"}}}"#);
    assert_eq!(memory(&config).lease_ttl, Duration::from_millis(10));
}

// ----- bad input: one test per kind

#[test]
fn unknown_top_level_key() {
    let message = json_err(
        &with_memory(r#""turnWaitMS": 5"#),
        &["turnWaitMS", "coordination config", "turnWaitMs"],
    );
    assert!(message.contains("did you mean \"turnWaitMs\""), "{message}");
    toml_err(
        "turnWaitMS = 5\n[coordinator.memory]\n",
        &["turnWaitMS", "coordination config"],
    );
    json_err(&with_memory(r#""retries": 3"#), &[r#""retries""#]);
}

#[test]
fn unknown_key_in_handover() {
    json_err(
        &with_memory(r#""handover": {"flows": "drop", "fallbak": "drop"}"#),
        &[r#""fallbak""#, "handover", "fallback"],
    );
    toml_err(
        "[coordinator.memory]\n[handover]\nflow = \"drop\"\n",
        &[r#""flow""#, "handover"],
    );
}

#[test]
fn unknown_key_in_memory_options() {
    json_err(
        r#"{"coordinator": {"memory": {"ttl": "10s"}}}"#,
        &[r#""ttl""#, "coordinator.memory", "leaseTtlMs"],
    );
    toml_err(
        "[coordinator.memory]\nlease_ttl_s = 10\n",
        &[r#""lease_ttl_s""#, "coordinator.memory"],
    );
}

#[test]
fn unknown_backend() {
    json_err(
        r#"{"coordinator": {"etcd": {"url": "http://localhost:2379"}}}"#,
        &["coordinator", r#""etcd""#, r#""memory""#],
    );
}

#[cfg(not(feature = "redis"))]
#[test]
fn redis_backend_needs_the_feature() {
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://localhost"}}}"#,
        &["coordinator", r#""redis""#, "cargo feature"],
    );
}

#[test]
fn coordinator_with_no_or_two_backends() {
    json_err(r#"{"coordinator": {}}"#, &["coordinator", "{}"]);
    json_err(
        r#"{"coordinator": {"memory": {}, "other": {}}}"#,
        &["coordinator", r#""other""#, r#""memory""#],
    );
}

#[test]
fn negative_number() {
    let message = json_err(
        &with_memory(r#""turnWaitMs": -5"#),
        &["turnWaitMs: -5 is negative", "whole number of milliseconds"],
    );
    assert!(message.contains(r#""2m""#), "{message}");
    toml_err(
        "settle_ms = -5\n[coordinator.memory]\n",
        &["settle_ms: -5 is negative"],
    );
    json_err(
        &with_memory(r#""settleMs": -2.0"#),
        &["settleMs: -2.0 is negative"],
    );
}

#[test]
fn fractional_number() {
    json_err(
        &with_memory(r#""providerDownMs": 1.5"#),
        &["providerDownMs: 1.5", "fractional"],
    );
    toml_err(
        "turnWait = 1.5\n[coordinator.memory]\n",
        &["turnWait: 1.5", "fractional"],
    );
}

#[test]
fn unparsable_string() {
    json_err(
        &with_memory(r#""turnWaitMs": "two minutes""#),
        &["turnWaitMs", r#""two minutes""#, "not a duration"],
    );
    // Digits without a unit are not guessed at.
    json_err(
        &with_memory(r#""settle": "1500""#),
        &["settle", r#""1500""#, "not a duration"],
    );
    json_err(
        &with_memory(r#""settle": """#),
        &["settle", r#""""#, "empty"],
    );
    toml_err(
        "[coordinator.memory]\nleaseTtl = \"10 parsecs\"\n",
        &["coordinator.memory.leaseTtl", r#""10 parsecs""#],
    );
}

#[test]
fn over_the_maximum_as_number() {
    json_err(
        &with_memory(r#""turnWaitMs": 2147483648"#),
        &["turnWaitMs: 2147483648 is too large", "2147483647"],
    );
    json_err(
        &with_memory(r#""turnWaitMs": 18446744073709551616"#),
        &["turnWaitMs", "too large"],
    );
    toml_err(
        "settleMs = 2147483648\n[coordinator.memory]\n",
        &["settleMs: 2147483648 is too large"],
    );
}

#[test]
fn over_the_maximum_as_string() {
    json_err(
        &with_memory(r#""turnWaitMs": "25d""#),
        &[r#"turnWaitMs: "25d" is too large"#, "2147483647"],
    );
    json_err(
        &with_memory(r#""settle": "2147483648ms""#),
        &[r#"settle: "2147483648ms" is too large"#],
    );
    json_err(
        &with_memory(r#""settle": "99999999999999999999999years""#),
        &["settle", "99999999999999999999999years", "too large"],
    );
    toml_err(
        "[coordinator.memory]\ndedup_window = \"1000 days\"\n",
        &[r#"coordinator.memory.dedup_window: "1000 days" is too large"#],
    );
}

#[test]
fn unknown_session_mode() {
    json_err(
        &with_memory(r#""providerSession": "bogus""#),
        &[
            r#"providerSession: unknown session mode "bogus""#,
            r#""leader", "shared" or "auto""#,
        ],
    );
    toml_err(
        "provider_session = \"Leader\"\n[coordinator.memory]\n",
        &[
            "provider_session",
            r#""Leader""#,
            r#"did you mean "leader"?"#,
        ],
    );
}

#[test]
fn unknown_flows_policy() {
    json_err(
        &with_memory(r#""handover": {"flows": "keep"}"#),
        &[
            r#"handover.flows: unknown flows policy "keep""#,
            r#""drop" or "resume""#,
        ],
    );
    toml_err(
        "[coordinator.memory]\n[handover]\nflows = \"keep\"\n",
        &[r#"handover.flows: unknown flows policy "keep""#],
    );
}

#[test]
fn unknown_fallback_policy() {
    json_err(
        &with_memory(r#""handover": {"fallback": "retry"}"#),
        &[
            r#"handover.fallback: unknown fallback policy "retry""#,
            r#""drop" or "restart""#,
        ],
    );
}

#[test]
fn missing_coordinator() {
    json_err(
        r#"{"turnWaitMs": "2m"}"#,
        &["missing key", r#""coordinator""#],
    );
    json_err("{}", &[r#""coordinator""#]);
    toml_err(
        "turnWaitMs = \"2m\"\n",
        &["missing key", r#""coordinator""#],
    );
}

#[test]
fn zero_turn_wait() {
    json_err(
        &with_memory(r#""turnWaitMs": 0"#),
        &["turnWaitMs: 0 is zero"],
    );
    json_err(
        &with_memory(r#""turn_wait": "0s""#),
        &[r#"turn_wait: "0s" is zero"#],
    );
    toml_err(
        "turnWait = 0\n[coordinator.memory]\n",
        &["turnWait: 0 is zero"],
    );
}

#[test]
fn lease_ttl_too_short() {
    json_err(
        r#"{"coordinator": {"memory": {"leaseTtlMs": 9}}}"#,
        &["coordinator.memory.leaseTtlMs: 9 is too short", "10ms"],
    );
    json_err(
        r#"{"coordinator": {"memory": {"lease_ttl": "0s"}}}"#,
        &[r#"coordinator.memory.lease_ttl: "0s" is too short"#],
    );
}

#[test]
fn wrong_type() {
    json_err(
        &with_memory(r#""turnWaitMs": true"#),
        &["turnWaitMs: true is a boolean", "duration"],
    );
    json_err(
        &with_memory(r#""settleMs": [1, 2]"#),
        &["settleMs: [1,2] is an array"],
    );
    json_err(
        &with_memory(r#""settleMs": {"s": 1}"#),
        &[r#"settleMs: {"s":1} is a map"#],
    );
    json_err(
        &with_memory(r#""settleMs": null"#),
        &["settleMs: null is not accepted"],
    );
    json_err(
        &with_memory(r#""providerSession": 1"#),
        &["providerSession: 1 is a number", r#""leader""#],
    );
    json_err(
        &with_memory(r#""handover": "drop""#),
        &[r#"handover: "drop" is a string"#],
    );
    json_err(
        r#"{"coordinator": "memory"}"#,
        &[r#"coordinator: "memory" is a string"#, r#"{"memory": {}}"#],
    );
    json_err(
        r#"{"coordinator": {"memory": 5}}"#,
        &["coordinator.memory: 5 is a number"],
    );
    json_err("[1]", &["coordination config: [1] is an array"]);
    toml_err(
        "turnWaitMs = true\n[coordinator.memory]\n",
        &["turnWaitMs: true is a boolean"],
    );
    toml_err(
        "turnWaitMs = 1979-05-27T07:32:00Z\n[coordinator.memory]\n",
        &["turnWaitMs: 1979-05-27T07:32:00Z is a date-time"],
    );
    toml_err(
        "settle = [\"1s\"]\n[coordinator.memory]\n",
        &[r#"settle: ["1s"] is an array"#],
    );
}

#[test]
fn same_field_under_two_spellings() {
    json_err(
        &with_memory(r#""turnWaitMs": 1000, "turn_wait": "1s""#),
        &["turn_wait", "given twice", "turnWaitMs"],
    );
    toml_err(
        "[coordinator.memory]\nleaseTtl = \"1s\"\nlease_ttl_ms = 1000\n",
        &["coordinator.memory.lease_ttl_ms", "given twice"],
    );
}

#[test]
fn syntax_errors_keep_serde_json_message() {
    let err = CoordinationConfig::from_json_str("{").expect_err("not JSON");
    assert!(err.to_string().starts_with("invalid config: "), "{err}");
    assert!(err.message().contains("line 1"), "{err}");
    // Text that is not JSON at all (TOML given to the JSON loader, say) says so.
    let err = CoordinationConfig::from_json_str("turnWaitMs = 5").expect_err("not JSON");
    assert!(
        err.message().starts_with("the text is not valid JSON: "),
        "{err}"
    );
    assert!(err.message().contains("line 1 column"), "{err}");
}

// ----- the parts on their own

#[test]
fn choices_parse_and_display() {
    for mode in [
        ProviderSession::Leader,
        ProviderSession::Shared,
        ProviderSession::Auto,
    ] {
        assert_eq!(mode.as_str().parse::<ProviderSession>(), Ok(mode));
        assert_eq!(mode.to_string(), mode.as_str());
    }
    assert_eq!("resume".parse::<FlowsPolicy>(), Ok(FlowsPolicy::Resume));
    assert_eq!(
        "restart".parse::<FallbackPolicy>(),
        Ok(FallbackPolicy::Restart)
    );
    let err = "sometimes"
        .parse::<ProviderSession>()
        .expect_err("unknown mode");
    assert!(err.to_string().contains(r#""sometimes""#), "{err}");
}

#[test]
fn parts_deserialize_on_their_own() {
    let options: MemoryOptions =
        serde_json::from_str(r#"{"leaseTtl": "2s"}"#).expect("memory options");
    assert_eq!(options.lease_ttl, Duration::from_secs(2));
    assert_eq!(options.dedup_window, MemoryOptions::DEFAULT_DEDUP_WINDOW);

    let handover: HandoverConfig =
        serde_json::from_str(r#"{"fallback": "restart"}"#).expect("handover");
    assert_eq!(handover.flows, FlowsPolicy::Drop);
    assert_eq!(handover.fallback, FallbackPolicy::Restart);

    let mode: ProviderSession = serde_json::from_str(r#""shared""#).expect("mode");
    assert_eq!(mode, ProviderSession::Shared);
    let err = serde_json::from_str::<ProviderSession>(r#""x""#).expect_err("bad mode");
    assert!(
        err.to_string()
            .contains(r#"providerSession: unknown session mode "x""#)
    );

    let coordinator: CoordinatorConfig =
        serde_json::from_str(r#"{"memory": {}}"#).expect("coordinator");
    assert_eq!(coordinator.backend(), "memory");

    let err =
        serde_json::from_str::<MemoryOptions>(r#"{"leaseTtlMs": -1}"#).expect_err("negative TTL");
    assert!(
        err.to_string().contains("leaseTtlMs: -1 is negative"),
        "{err}"
    );
}

#[test]
fn embeds_in_a_larger_config() {
    #[derive(serde::Deserialize)]
    struct BotConfig {
        #[allow(dead_code)]
        name: String,
        coordination: Option<CoordinationConfig>,
    }
    let bot: BotConfig = toml::from_str(
        r#"
name = "shop"
[coordination]
turnWaitMs = "45s"
[coordination.coordinator.memory]
"#,
    )
    .expect("bot config");
    let coordination = bot.coordination.expect("coordination given");
    assert_eq!(coordination.turn_wait, Duration::from_secs(45));

    let bot: BotConfig = toml::from_str("name = \"shop\"\n").expect("bot config");
    assert!(bot.coordination.is_none());
}

// ----- sharing one coordinator

#[test]
fn from_arc_of_a_concrete_coordinator() {
    let c: CoordinatorConfig = Arc::new(MemoryCoordinator::new()).into();
    assert!(matches!(c, CoordinatorConfig::Shared(_)), "{c:?}");
    assert_eq!(c.backend(), "memory");
    assert_eq!(format!("{c:?}"), r#"Shared("memory")"#);

    // The same instance goes in.
    let memory = Arc::new(MemoryCoordinator::new());
    let config = CoordinationConfig::new(memory.clone().into());
    let as_dyn: Arc<dyn Coordinator> = memory;
    match &config.coordinator {
        CoordinatorConfig::Shared(inner) => assert!(Arc::ptr_eq(inner, &as_dyn)),
        other => panic!("expected a shared coordinator, got {other:?}"),
    }

    // Any coordinator type converts, not only the memory one.
    let c: CoordinatorConfig = Arc::new(NamedBackend).into();
    assert_eq!(c.backend(), "test-backend");
}

fn shared_inner(config: &CoordinationConfig) -> Arc<dyn Coordinator> {
    match &config.coordinator {
        CoordinatorConfig::Shared(inner) => inner.clone(),
        other => panic!("expected a shared coordinator, got {other:?}"),
    }
}

#[test]
fn shared_config_clones_use_one_coordinator() {
    let spec = CoordinationConfig::new(CoordinatorConfig::Memory(
        MemoryOptions::default().with_lease_ttl(Duration::from_secs(3)),
    ))
    .with_turn_wait(Duration::from_secs(7));

    let config = spec.clone().shared().expect("memory coordinator builds");
    // The other settings are kept.
    assert_eq!(config.turn_wait, Duration::from_secs(7));
    let first = shared_inner(&config);
    assert_eq!(first.backend(), "memory");
    assert_eq!(first.lease_ttl(), Duration::from_secs(3));
    for copy in [config.clone(), config.clone()] {
        assert!(Arc::ptr_eq(&first, &shared_inner(&copy)));
        // Building a shared config hands out the same instance too.
        let built = copy.coordinator.build().expect("shared builds");
        assert!(Arc::ptr_eq(&first, &built));
    }

    // Sharing a config that is already shared keeps its instance.
    let again = config.clone().shared().expect("already shared");
    assert!(Arc::ptr_eq(&first, &shared_inner(&again)));

    // A memory spec, by contrast, creates a new coordinator on every build.
    let a = spec.coordinator.build().expect("builds");
    let b = spec.coordinator.build().expect("builds");
    assert!(!Arc::ptr_eq(&a, &b));
    let other = spec.shared().expect("builds");
    assert!(!Arc::ptr_eq(&first, &shared_inner(&other)));
}

#[test]
fn build_refuses_invalid_memory_options() {
    let config = CoordinationConfig::new(CoordinatorConfig::Memory(
        MemoryOptions::default().with_lease_ttl(Duration::from_millis(1)),
    ));
    let err = config.shared().expect_err("lease TTL too short");
    assert!(
        err.to_string().contains("coordinator.memory.leaseTtlMs"),
        "{err}"
    );
}

// ----- redis

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use botmesh::redis::RedisOptions;

    fn redis(config: &CoordinationConfig) -> RedisOptions {
        match &config.coordinator {
            CoordinatorConfig::Redis(options) => options.clone(),
            other => panic!("expected a redis coordinator, got {other:?}"),
        }
    }

    fn assert_full_redis(config: &CoordinationConfig) {
        let options = redis(config);
        assert_eq!(options.url, "redis://user:pass@host:6379/0");
        assert_eq!(options.key_prefix, "mybot");
        assert_eq!(options.lease_ttl, Duration::from_secs(10));
        assert_eq!(options.dedup_window, Duration::from_secs(600));
        assert_eq!(options.command_timeout, Duration::from_secs(2));
        assert_eq!(config.coordinator.backend(), "redis");
        assert_eq!(config.turn_wait, Duration::from_secs(30));
    }

    #[test]
    fn camel_case_json() {
        let config = json(
            r#"{"coordinator": {"redis": {"url": "redis://user:pass@host:6379/0",
                "keyPrefix": "mybot", "leaseTtl": "10s", "dedupWindow": "10m",
                "commandTimeout": "2s"}}, "turnWaitMs": 30000}"#,
        );
        assert_full_redis(&config);
        let config = json(
            r#"{"coordinator": {"redis": {"url": "redis://user:pass@host:6379/0",
                "keyPrefix": "mybot", "leaseTtlMs": 10000, "dedupWindowMs": 600000,
                "commandTimeoutMs": 2000}}, "turnWaitMs": 30000}"#,
        );
        assert_full_redis(&config);
    }

    #[test]
    fn snake_case_json() {
        let config = json(
            r#"{"coordinator": {"redis": {"url": "redis://user:pass@host:6379/0",
                "key_prefix": "mybot", "lease_ttl_ms": 10000, "dedup_window_ms": "10m",
                "command_timeout_ms": 2000}}, "turn_wait_ms": 30000}"#,
        );
        assert_full_redis(&config);
        let config = json(
            r#"{"coordinator": {"redis": {"url": "redis://user:pass@host:6379/0",
                "key_prefix": "mybot", "lease_ttl": "10s", "dedup_window": "10m",
                "command_timeout": "2s"}}, "turn_wait": "30s"}"#,
        );
        assert_full_redis(&config);
    }

    #[test]
    fn camel_and_snake_case_toml() {
        let config = toml_ok(
            r#"
turnWaitMs = 30000
[coordinator.redis]
url = "redis://user:pass@host:6379/0"
keyPrefix = "mybot"
leaseTtl = "10s"
dedupWindowMs = 600000
commandTimeout = "2s"
"#,
        );
        assert_full_redis(&config);
        let config = toml_ok(
            r#"
turn_wait = "30s"
[coordinator.redis]
url = "redis://user:pass@host:6379/0"
key_prefix = "mybot"
lease_ttl_ms = 10000
dedup_window = "10m"
command_timeout_ms = 2000
"#,
        );
        assert_full_redis(&config);
    }

    #[test]
    fn only_url_takes_defaults_and_every_scheme_is_accepted() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock",
            "REDIS://HOST:6379",
        ] {
            let config = json(&format!(
                r#"{{"coordinator": {{"redis": {{"url": "{url}"}}}}}}"#
            ));
            let options = redis(&config);
            let defaults = RedisOptions::new(url);
            assert_eq!(options.url, url);
            assert_eq!(options.key_prefix, defaults.key_prefix);
            assert_eq!(options.lease_ttl, defaults.lease_ttl);
            assert_eq!(options.dedup_window, defaults.dedup_window);
            assert_eq!(options.command_timeout, defaults.command_timeout);
            assert!(config.validate().is_ok());
        }
        let options: RedisOptions =
            serde_json::from_str(r#"{"url": "redis://h:1", "keyPrefix": "p"}"#).expect("options");
        assert_eq!(options.key_prefix, "p");
        // rediss:// needs botmesh's `tls` feature: without it, a URL that cannot work
        // is refused at load, naming the field; with it, it loads.
        #[cfg(not(feature = "tls"))]
        json_err(
            r#"{"coordinator": {"redis": {"url": "rediss://host:6380"}}}"#,
            &["coordinator.redis.url: not a usable Redis URL", "TLS"],
        );
        #[cfg(feature = "tls")]
        assert_eq!(
            redis(&json(
                r#"{"coordinator": {"redis": {"url": "rediss://host:6380"}}}"#
            ))
            .url,
            "rediss://host:6380"
        );
    }

    #[test]
    fn cluster_seeds_in_json_and_toml() {
        let config = json(
            r#"{"coordinator": {"redis": {"cluster": ["redis://10.0.0.5:7000", "redis://10.0.0.6:7001"],
                "keyPrefix": "mybot"}}}"#,
        );
        let options = redis(&config);
        assert_eq!(
            options.cluster,
            ["redis://10.0.0.5:7000", "redis://10.0.0.6:7001"]
        );
        assert!(options.url.is_empty());
        assert!(config.validate().is_ok());
        let config = toml_ok(
            "[coordinator.redis]\ncluster = [\"redis://127.0.0.1:7000\"]\nkey_prefix = \"p\"\n",
        );
        assert_eq!(redis(&config).cluster, ["redis://127.0.0.1:7000"]);
        // Set in code.
        let config = CoordinationConfig::new(CoordinatorConfig::Redis(RedisOptions::cluster([
            "redis://127.0.0.1:7000",
        ])));
        assert!(config.validate().is_ok());
    }

    #[test]
    fn sentinel_and_tls_in_json_and_toml() {
        let config = json(
            r#"{"coordinator": {"redis": {"sentinel": {"urls": ["redis://127.0.0.1:26379"],
                "service": "mymaster"}, "tls": {"caFile": "/etc/ca.pem",
                "clientCert": "/etc/c.pem", "clientKey": "/etc/k.pem"}}}}"#,
        );
        let options = redis(&config);
        let sentinel = options.sentinel.clone().expect("sentinel");
        assert_eq!(sentinel.urls, ["redis://127.0.0.1:26379"]);
        assert_eq!(sentinel.service, "mymaster");
        assert_eq!(
            options.tls.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let config = toml_ok(
            "[coordinator.redis.sentinel]\nurls = [\"redis://h:26379\"]\nservice = \"m\"\n\
             [coordinator.redis.tls]\nca_file = \"/ca.pem\"\n",
        );
        assert_eq!(redis(&config).sentinel.expect("sentinel").service, "m");
    }

    #[test]
    fn cluster_and_sentinel_errors_name_the_field() {
        json_err(
            r#"{"coordinator": {"redis": {"cluster": []}}}"#,
            &["coordinator.redis.cluster", "empty"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:1", "cluster": ["redis://h:2"]}}}"#,
            &["coordinator.redis.url, cluster", "more than one"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"cluster": ["redis://h:2"],
                "sentinel": {"urls": ["redis://h:3"], "service": "m"}}}}"#,
            &["cluster, sentinel", "more than one"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"cluster": ["redis://h:1", "http://h:2"]}}}"#,
            &["coordinator.redis.cluster[1]", "not a Redis URL"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"cluster": ["redis://h:1", "redis://h:port"]}}}"#,
            &["coordinator.redis.cluster[1]", "\"port\" is not a number"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"sentinel": {"urls": [], "service": "m"}}}}"#,
            &["coordinator.redis.sentinel.urls", "empty"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"sentinel": {"urls": ["redis://h:1"], "service": " "}}}}"#,
            &["coordinator.redis.sentinel.service", "\" \"", "empty"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:1", "tls": {"clientCert": "/c.pem"}}}}"#,
            &["tls.clientCert, tls.clientKey", "both"],
        );
        // In code: the same checks, through validate.
        let mixed = RedisOptions {
            cluster: vec!["redis://h:2".into()],
            ..RedisOptions::new("redis://h:1")
        };
        let e = CoordinationConfig::new(CoordinatorConfig::Redis(mixed))
            .validate()
            .expect_err("refused");
        assert!(
            e.to_string().contains("coordinator.redis.url, cluster"),
            "{e}"
        );
        let e = CoordinationConfig::new(CoordinatorConfig::Redis(RedisOptions::cluster(Vec::<
            String,
        >::new(
        ))))
        .validate()
        .expect_err("refused");
        let e = e.to_string();
        assert!(
            e.contains("coordinator.redis.url: missing") && e.contains("cluster"),
            "{e}"
        );
    }

    #[test]
    fn missing_url() {
        json_err(
            r#"{"coordinator": {"redis": {"keyPrefix": "mybot"}}}"#,
            &["coordinator.redis.url", "missing"],
        );
        json_err(
            r#"{"coordinator": {"redis": {}}}"#,
            &["coordinator.redis.url", "missing"],
        );
        toml_err(
            "[coordinator.redis]\nkey_prefix = \"mybot\"\n",
            &["coordinator.redis.url", "missing"],
        );
        let err = serde_json::from_str::<RedisOptions>("{}").expect_err("no url");
        assert!(err.to_string().contains("url: missing"), "{err}");
    }

    #[test]
    fn bad_url_is_refused_without_showing_it() {
        for url in [
            "http://user:secret@x",
            "secret",
            "redis:/secret@x",
            "redis://",
            "",
        ] {
            let message = json_err(
                &format!(r#"{{"coordinator": {{"redis": {{"url": "{url}"}}}}}}"#),
                &["coordinator.redis.url"],
            );
            assert!(!message.contains("secret"), "{message}");
        }
        json_err(
            r#"{"coordinator": {"redis": {"url": "http://user:secret@x"}}}"#,
            &[
                "coordinator.redis.url: not a Redis URL",
                "redis://host:port",
            ],
        );
        // The spelling of the field is kept; TOML reports the same message (its own
        // rendering adds the source line, so only the message itself is checked).
        let err = toml::from_str::<CoordinationConfig>(
            "[coordinator.redis]\nurl = \"http://user:secret@x\"\n",
        )
        .expect_err("bad scheme");
        assert!(
            err.message()
                .contains("coordinator.redis.url: not a Redis URL"),
            "{err}"
        );
        assert!(!err.message().contains("secret"), "{err}");

        // A URL of the wrong type, or given in place of the options map or of the
        // coordinator, is not shown either.
        for text in [
            r#"{"coordinator": {"redis": {"url": ["redis://user:secret@x"]}}}"#,
            r#"{"coordinator": {"redis": {"url": {"redis://user:secret@x": 1}}}}"#,
            r#"{"coordinator": {"redis": "redis://user:secret@x"}}"#,
            r#"{"coordinator": "redis://user:secret@x"}"#,
        ] {
            let message = json_err(text, &["coordinator"]);
            assert!(!message.contains("secret"), "{message}");
        }
        json_err(
            r#"{"coordinator": {"redis": {"url": 5}}}"#,
            &["coordinator.redis.url", "is a number", "redis://"],
        );

        // Set in code: validate() refuses it the same way.
        let config = CoordinationConfig::new(CoordinatorConfig::redis("http://user:secret@x"));
        let err = config.validate().expect_err("bad scheme");
        assert!(
            err.to_string()
                .contains("coordinator.redis.url: not a Redis URL"),
            "{err}"
        );
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = config.shared().expect_err("bad scheme");
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn debug_never_shows_the_url() {
        let config =
            json(r#"{"coordinator": {"redis": {"url": "redis://user:secret@host:6379"}}}"#);
        for shown in [format!("{config:?}"), format!("{:?}", config.coordinator)] {
            assert!(!shown.contains("secret"), "{shown}");
            assert!(shown.contains("Redis"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(shown.contains("botmesh"), "{shown}");
        }
    }

    #[test]
    fn key_prefix_with_a_brace_or_empty() {
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "keyPrefix": "my{bot}"}}}"#,
            &["coordinator.redis.keyPrefix", r#""my{bot}""#, "brace"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "key_prefix": "a}"}}}"#,
            &["coordinator.redis.key_prefix", r#""a}""#],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "keyPrefix": ""}}}"#,
            &["coordinator.redis.keyPrefix", r#""""#, "empty"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "keyPrefix": 3}}}"#,
            &["coordinator.redis.keyPrefix: 3 is a number"],
        );
        toml_err(
            "[coordinator.redis]\nurl = \"redis://h:6379\"\nkeyPrefix = \"{x\"\n",
            &["coordinator.redis.keyPrefix", r#""{x""#],
        );
        let err =
            CoordinationConfig::new(RedisOptions::new("redis://h").with_key_prefix("{x}").into())
                .validate()
                .expect_err("brace");
        assert!(
            err.to_string()
                .contains(r#"coordinator.redis.keyPrefix: "{x}""#),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_in_redis_options() {
        let message = json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "password": "x"}}}"#,
            &[r#""password""#, "coordinator.redis", "url, keyPrefix"],
        );
        assert!(!message.contains("redis://h:6379"), "{message}");
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "keyprefix": "x"}}}"#,
            &[r#""keyprefix""#, r#"did you mean "keyPrefix""#],
        );
        toml_err(
            "[coordinator.redis]\nurl = \"redis://h:6379\"\nprefix = \"x\"\n",
            &[r#""prefix""#, "coordinator.redis"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "leaseTtl": "1s", "lease_ttl_ms": 1000}}}"#,
            &["coordinator.redis.lease_ttl_ms", "given twice"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h"}, "memory": {}}}"#,
            &[r#""memory""#, r#""redis""#, "exactly one backend"],
        );
    }

    #[test]
    fn redis_durations() {
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "leaseTtlMs": 9}}}"#,
            &["coordinator.redis.leaseTtlMs: 9 is too short", "10ms"],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "commandTimeout": "0s"}}}"#,
            &[r#"coordinator.redis.commandTimeout: "0s" is too short"#],
        );
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "dedupWindowMs": -1}}}"#,
            &["coordinator.redis.dedupWindowMs: -1 is negative"],
        );
        let config = json(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "leaseTtl": "10ms", "dedupWindow": 0}}}"#,
        );
        assert_eq!(redis(&config).lease_ttl, Duration::from_millis(10));
        assert_eq!(redis(&config).dedup_window, Duration::ZERO);

        let err = CoordinationConfig::new(
            RedisOptions::new("redis://h")
                .with_command_timeout(Duration::ZERO)
                .into(),
        )
        .validate()
        .expect_err("zero timeout");
        assert!(
            err.to_string()
                .contains("coordinator.redis.commandTimeoutMs"),
            "{err}"
        );
    }

    #[test]
    fn build_reports_an_unreachable_server_without_the_url() {
        // Port 1 on loopback refuses connections at once.
        let config = CoordinationConfig::new(
            RedisOptions::new("redis://user:secret@127.0.0.1:1")
                .with_command_timeout(Duration::from_millis(500))
                .into(),
        );
        let err = config.shared().expect_err("nothing listens on port 1");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}

/// A huge value or key is shortened in the error, not echoed whole.
#[test]
fn huge_values_are_shortened_in_errors() {
    let big = "x".repeat(100_000);
    for json in [
        format!(r#"{{"coordinator": {{"memory": {{}}}}, "{big}": 1}}"#),
        format!(r#"{{"coordinator": {{"memory": {{}}}}, "turnWaitMs": "{big}"}}"#),
        format!(r#"{{"coordinator": {{"memory": {{}}}}, "providerSession": "{big}"}}"#),
    ] {
        let err = botmesh::CoordinationConfig::from_json_str(&json).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.len() < 1_000,
            "{} bytes: {}…",
            text.len(),
            &text[..200]
        );
    }
}

/// Settings that cannot work together are refused, naming the fields: a Redis command
/// timeout that (with its one retry) outlasts the lease, a clock drift allowance that
/// reaches the renewal period.
#[test]
#[cfg(feature = "redis")]
fn settings_that_cannot_work_together_are_refused() {
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://127.0.0.1:1", "leaseTtl": "300ms", "commandTimeout": "5s"}}}"#,
        &[
            "coordinator.redis.commandTimeoutMs",
            "5s",
            "leaseTtlMs",
            "300ms",
        ],
    );
    let options = botmesh::redis::RedisOptions::new("redis://127.0.0.1:1")
        .with_lease_ttl(Duration::from_millis(300))
        .with_command_timeout(Duration::from_secs(5));
    let err = botmesh::redis::RedisCoordinator::connect(options).expect_err("refused");
    assert!(err.to_string().contains("commandTimeoutMs"), "{err}");
    // A short TTL alone works: the default command timeout follows it.
    let short =
        json(r#"{"coordinator": {"redis": {"url": "redis://127.0.0.1:1", "leaseTtl": "300ms"}}}"#);
    let CoordinatorConfig::Redis(options) = &short.coordinator else {
        panic!("redis");
    };
    assert_eq!(options.command_timeout, Duration::from_millis(100));
    json_err(
        r#"{"coordinator": {"memory": {"leaseTtl": "3s"}}, "clockDriftMs": 1000}"#,
        &["clockDriftMs", "1s", "leaseTtlMs", "3s"],
    );
}

#[test]
fn clock_drift_loads_in_either_spelling() {
    for key in [
        "clockDriftMs",
        "clock_drift_ms",
        "clockDrift",
        "clock_drift",
    ] {
        let config = json(&format!(
            r#"{{"coordinator": {{"memory": {{}}}}, "{key}": "250ms"}}"#
        ));
        assert_eq!(
            config.clock_drift,
            Some(Duration::from_millis(250)),
            "{key}"
        );
    }
    assert_eq!(json(r#"{"coordinator": {"memory": {}}}"#).clock_drift, None);
}

// ----- dedupIds

/// `dedupIds` (handled message ids a chat remembers at least) reads as a whole number
/// from 1 to 10,000 for both backends, defaults to 64, and a value out of range or of
/// the wrong kind is refused naming the field and the value.
#[test]
fn dedup_ids_is_read_checked_and_defaulted() {
    assert_eq!(
        memory(&json(r#"{"coordinator": {"memory": {}}}"#)).dedup_ids,
        botmesh::DEFAULT_DEDUP_IDS
    );
    assert_eq!(
        memory(&json(r#"{"coordinator": {"memory": {"dedupIds": 128}}}"#)).dedup_ids,
        128
    );
    json_err(
        r#"{"coordinator": {"memory": {"dedupIds": 0}}}"#,
        &["coordinator.memory.dedupIds: 0 is out of range"],
    );
    json_err(
        r#"{"coordinator": {"memory": {"dedupIds": "64"}}}"#,
        &["coordinator.memory.dedupIds", "\"64\" is a string"],
    );
    let err = MemoryOptions::default().with_dedup_ids(20_000).validate();
    assert!(
        err.is_err_and(|e| e.to_string().contains("dedupIds: 20000 is out of range")),
        "refused in code too"
    );
    #[cfg(feature = "redis")]
    {
        let config =
            json(r#"{"coordinator": {"redis": {"url": "redis://h:6379", "dedupIds": 32}}}"#);
        let CoordinatorConfig::Redis(options) = &config.coordinator else {
            panic!("a redis coordinator");
        };
        assert_eq!(options.dedup_ids, 32);
        json_err(
            r#"{"coordinator": {"redis": {"url": "redis://h:6379", "dedupIds": 10001}}}"#,
            &["coordinator.redis.dedupIds: 10001 is out of range"],
        );
    }
}

// ----- chatCapacity

/// `chatCapacity` (chats a memory coordinator is prepared for) reads as a whole number
/// from 0 to 2^24 in either spelling, defaults to 0 (grow as needed), builds a working
/// coordinator, and a value out of range or of the wrong kind is refused naming the
/// field and the value; a Redis coordinator does not take it.
#[test]
fn chat_capacity_is_read_checked_and_defaulted() {
    assert_eq!(
        memory(&json(r#"{"coordinator": {"memory": {}}}"#)).chat_capacity,
        0
    );
    for key in ["chatCapacity", "chat_capacity"] {
        let config = json(&format!(
            r#"{{"coordinator": {{"memory": {{"{key}": 5000}}}}}}"#
        ));
        assert_eq!(memory(&config).chat_capacity, 5000, "{key}");
    }
    json_err(
        r#"{"coordinator": {"memory": {"chatCapacity": 16777217}}}"#,
        &[
            "coordinator.memory.chatCapacity: 16777217 is out of range",
            "16777216",
        ],
    );
    json_err(
        r#"{"coordinator": {"memory": {"chatCapacity": -1}}}"#,
        &["coordinator.memory.chatCapacity", "-1"],
    );
    json_err(
        r#"{"coordinator": {"memory": {"chatCapacity": 100000.0}}}"#,
        &[
            "coordinator.memory.chatCapacity: 100000.0 is a number",
            "whole number",
        ],
    );
    let refused = botmesh::MemoryCoordinator::new()
        .try_with_chat_capacity(botmesh::MAX_CHAT_CAPACITY + 1)
        .err()
        .map(|e| e.to_string());
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("16777217 is out of range")),
        "{refused:?}"
    );
    json_err(
        r#"{"coordinator": {"memory": {"chatCapacity": "50000"}}}"#,
        &["coordinator.memory.chatCapacity", "\"50000\" is a string"],
    );
    let err = MemoryOptions::default()
        .with_chat_capacity(botmesh::MAX_CHAT_CAPACITY + 1)
        .validate();
    assert!(
        err.is_err_and(|e| e
            .to_string()
            .contains("chatCapacity: 16777217 is out of range")),
        "refused in code too"
    );
    // Built, it takes turns like any other.
    let config = json(r#"{"coordinator": {"memory": {"chatCapacity": 1000}}}"#);
    let coordinator = config.coordinator.build().expect("a memory coordinator");
    let replica = botmesh::Replica::start("r1", coordinator).expect("started");
    for chat in ["a", "b", "a"] {
        let turn = replica
            .acquire_timeout(chat, Duration::from_secs(5))
            .expect("a free chat");
        turn.release().expect("released");
    }
    replica.shutdown();
    #[cfg(feature = "redis")]
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://h:6379", "chatCapacity": 10}}}"#,
        &["chatCapacity"],
    );
}

/// `waitReplicas` (replicas that must acknowledge each write, Redis) reads as a whole
/// number from 0 to 100 in either spelling, defaults to 0 (off), and anything else is
/// refused naming the field and the value.
#[cfg(feature = "redis")]
#[test]
fn wait_replicas_is_read_checked_and_defaulted() {
    let read = |text: &str| {
        let config = json(text);
        let CoordinatorConfig::Redis(options) = &config.coordinator else {
            panic!("a redis coordinator");
        };
        options.wait_replicas
    };
    assert_eq!(
        read(r#"{"coordinator": {"redis": {"url": "redis://h:6379"}}}"#),
        0
    );
    assert_eq!(
        read(r#"{"coordinator": {"redis": {"url": "redis://h:6379", "waitReplicas": 1}}}"#),
        1
    );
    assert_eq!(
        read(r#"{"coordinator": {"redis": {"url": "redis://h:6379", "wait_replicas": 2}}}"#),
        2
    );
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://h:6379", "waitReplicas": 101}}}"#,
        &["coordinator.redis.waitReplicas: 101 is out of range"],
    );
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://h:6379", "waitReplicas": -1}}}"#,
        &["coordinator.redis.waitReplicas"],
    );
    json_err(
        r#"{"coordinator": {"redis": {"url": "redis://h:6379", "waitReplicas": "1"}}}"#,
        &["coordinator.redis.waitReplicas", "\"1\" is a string"],
    );
}

/// The Redis Cluster and Sentinel maps of another shape are refused naming the field,
/// never quoting a value (a URL may hold a password); a cluster URL with a database
/// other than 0 (Redis Cluster has only database 0) is refused at load.
#[cfg(feature = "redis")]
#[test]
fn cluster_and_sentinel_of_the_wrong_shape_are_named() {
    json_err(
        r#"{"coordinator": {"redis": {"cluster": "redis://u:secret@h:7000"}}}"#,
        &["coordinator.redis.cluster: expected a list of seed node URLs"],
    );
    let e = CoordinationConfig::from_json_str(
        r#"{"coordinator": {"redis": {"cluster": "redis://u:secret@h:7000"}}}"#,
    )
    .expect_err("refused");
    assert!(!e.to_string().contains("secret"), "{e}");
    json_err(
        r#"{"coordinator": {"redis": {"sentinel": {"urls": ["redis://h:26379"]}}}}"#,
        &[
            "coordinator.redis.sentinel: missing field `service`",
            "\"service\"",
        ],
    );
    json_err(
        r#"{"coordinator": {"redis": {"cluster": ["redis://h:7000/3"]}}}"#,
        &["cluster[0]: database 3 was asked for", "database 0 only"],
    );
}

/// A coordinator built in code with a lease TTL no lease can be held with (the memory
/// backend raises zero to 1 ms) is refused when the bot is built, naming the field.
#[test]
fn a_shared_coordinator_with_an_unworkable_ttl_is_refused() {
    let coordinator: std::sync::Arc<dyn botmesh::Coordinator> = std::sync::Arc::new(
        botmesh::MemoryCoordinator::with_settings(Duration::ZERO, Duration::from_secs(60)),
    );
    let config = botmesh::CoordinatorConfig::Shared(coordinator);
    let err = config.validate().expect_err("a 1 ms lease is refused");
    assert!(
        err.to_string().contains("coordinator.shared.leaseTtl"),
        "names the field: {err}"
    );
}
