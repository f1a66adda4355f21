//! The Prometheus text exposition of the metrics: parsed back line by line (HELP, TYPE,
//! samples with labels), histogram buckets cumulative and closed by `+Inf` = `_count`,
//! the leader gauge per provider with a `name` label, and no chat id anywhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    Bot, Capabilities, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message, Provider,
    ProviderError, Session, Status,
};
use crossbeam_channel::{bounded, unbounded};

struct Exclusive(crossbeam_channel::Sender<()>);

impl Provider for Exclusive {
    fn id(&self) -> &str {
        "wa \"main\"\\1" // quotes and a backslash: must be escaped in the label
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: true,
        }
    }
    fn start(&self, session: Session) -> Result<(), ProviderError> {
        session.status().report(Status::Open);
        let _ = self.0.send(());
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `{a="x",b="y"}` (with the text format's escapes); returns the labels and
/// the rest of the line.
fn labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut out = BTreeMap::new();
    let Some(body) = s.strip_prefix('{') else {
        return (out, s);
    };
    let mut chars = body.char_indices().peekable();
    loop {
        let start = chars.peek().map(|(i, _)| *i).expect("label");
        if body[start..].starts_with('}') {
            return (out, &body[start + 1..]);
        }
        let eq = body[start..].find("=\"").expect("label =\"") + start;
        let key = body[start..eq].to_owned();
        assert!(is_name(&key), "label name {key:?}");
        while chars.peek().is_some_and(|(i, _)| *i < eq + 2) {
            chars.next();
        }
        let mut value = String::new();
        loop {
            match chars.next().expect("label value ends") {
                (_, '\\') => match chars.next().expect("escape").1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => panic!("bad escape \\{c}"),
                },
                (_, '"') => break,
                (_, c) => value.push(c),
            }
        }
        out.insert(key, value);
        if let Some((_, ',')) = chars.peek() {
            chars.next();
        }
    }
}

/// Parses the whole exposition; panics on anything the format does not allow.
fn parse(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    assert!(text.ends_with('\n'));
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("help text");
            assert!(is_name(name) && !help.is_empty(), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("type");
            assert!(is_name(name), "{line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "twice: {line}"
            );
        } else {
            let end = line.find(['{', ' ']).expect("sample");
            let name = &line[..end];
            assert!(is_name(name), "{line}");
            let (labels, rest) = labels(&line[end..]);
            let value: f64 = rest.trim().parse().expect("value");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(name);
            let kind = types
                .get(family)
                .unwrap_or_else(|| panic!("no TYPE before {line}"));
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{line}");
            }
            samples.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
    }
    (types, samples)
}

#[test]
fn metrics_text_parses_back_with_counters_histogram_and_leader_gauge() {
    let (opened_tx, opened_rx) = bounded(1);
    let (ended_tx, ended_rx) = unbounded();
    let coordinator = Arc::new(MemoryCoordinator::new());
    let bot = Bot::builder()
        .id("r1")
        .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(
            coordinator,
        )))
        .provider(Arc::new(Exclusive(opened_tx)))
        .handler(|_| Ok(()))
        .on_outcome(move |_, _| {
            let _ = ended_tx.send(());
        })
        .build()
        .expect("bot");
    opened_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("leads");
    for i in 0..20 {
        bot.intake()
            .deliver(Message::new(format!("secret-chat-{}", i % 3), "x").with_id(i.to_string()))
            .expect("deliver");
    }
    for _ in 0..20 {
        ended_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("ended");
    }
    let text = bot.metrics_text();
    assert!(
        !text.contains("secret-chat"),
        "a chat id in the metrics:\n{text}"
    );
    let (types, samples) = parse(&text);
    let get = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .value
    };
    assert_eq!(get("botmesh_messages_accepted_total"), 20.0);
    assert_eq!(get("botmesh_messages_handled_total"), 20.0);
    assert_eq!(types["botmesh_turns_held"], "gauge");
    assert_eq!(types["botmesh_turn_wait_seconds"], "histogram");
    // Buckets: `le` rising, counts cumulative, +Inf last and equal to _count.
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "botmesh_turn_wait_seconds_bucket")
        .collect();
    assert_eq!(buckets.len(), 32);
    let mut last = (f64::NEG_INFINITY, 0.0);
    for b in &buckets {
        let le = match b.labels["le"].as_str() {
            "+Inf" => f64::INFINITY,
            le => le.parse().expect("le"),
        };
        assert!(le > last.0 && b.value >= last.1, "{b:?}");
        last = (le, b.value);
    }
    assert_eq!(last.0, f64::INFINITY);
    let count = get("botmesh_turn_wait_seconds_count");
    assert_eq!(last.1, count);
    assert_eq!(count, get("botmesh_turns_granted_total"));
    assert!(get("botmesh_turn_wait_seconds_sum") >= 0.0);
    // One leader gauge per provider, named like client-go's, with the id escaped.
    let leader: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "botmesh_leader_election_master_status")
        .collect();
    assert_eq!(leader.len(), 1, "{text}");
    assert_eq!(leader[0].labels["name"], "wa \"main\"\\1");
    assert_eq!(leader[0].value, 1.0);
    bot.stop().expect("stop");
    let after = bot.metrics_text();
    let (_, samples) = parse(&after);
    let leading = samples
        .iter()
        .find(|s| s.name == "botmesh_leader_election_master_status")
        .expect("gauge");
    assert_eq!(leading.value, 0.0, "a stopped replica does not lead");
}

#[test]
fn a_bot_without_providers_has_no_leader_gauge() {
    let bot = Bot::builder().handler(|_| Ok(())).build().expect("bot");
    let text = bot.metrics_text();
    let (types, _) = parse(&text);
    assert!(!types.contains_key("botmesh_leader_election_master_status"));
    assert!(types.contains_key("botmesh_info"));
    bot.shutdown();
}
