//! The Telegram transport against the fake Bot API (`support::fake_telegram`), with
//! replicas as threads: long polling, conflicts, rate limits, replies with keyboards,
//! retries, the fence, and webhooks.
#![cfg(feature = "telegram")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use botmesh::telegram::{SECRET_HEADER, Telegram, TelegramConfig, Update, Webhook};
use botmesh::{
    Bot, CoordinationConfig, CoordinatorConfig, Fence, Flow, InlineButton, Keyboard,
    MemoryCoordinator, Provider, Reply,
};
use serde_json::json;
use support::fake_telegram::{FakeTelegram, PollEnd};
use support::serial;

const LONG: Duration = Duration::from_secs(30);
const TOKEN: &str = "123:TEST";

fn config(url: &str) -> TelegramConfig {
    TelegramConfig::new(TOKEN)
        .with_api_url(url)
        .with_poll_timeout(Duration::from_secs(1))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .with_send_retry_for(Duration::from_secs(5))
}

fn echo_bot(id: &str, telegram: Telegram, coordination: Option<CoordinationConfig>) -> Bot {
    let mut b = Bot::builder()
        .id(id)
        .workers(2)
        .provider(Arc::new(telegram))
        .handler(|ctx| Ok(ctx.reply(&ctx.message().text)?));
    if let Some(c) = coordination {
        b = b.coordination(c);
    }
    b.build().expect("bot")
}

/// The texts sent to each chat, in the order the fake API received them.
fn by_chat(fake: &FakeTelegram) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for s in fake.sends() {
        m.entry(s.chat.to_string()).or_default().push(s.text);
    }
    m
}

#[test]
fn long_polling_answers_every_update_in_order_and_confirms_offsets() {
    let fake = FakeTelegram::start();
    let bot = echo_bot(
        "solo",
        Telegram::long_polling(config(&fake.url())).expect("config"),
        None,
    );
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..30 {
        let chat = 100 + i % 3;
        let text = format!("m{i}");
        fake.push_text(chat, &text);
        expected.entry(chat.to_string()).or_default().push(text);
    }
    assert!(fake.wait_sends(30, LONG), "{} sent", fake.sends().len());
    assert_eq!(by_chat(&fake), expected);
    // Every update was accepted, so every offset gets confirmed by a later poll.
    assert!(
        fake.wait_all_confirmed(LONG),
        "confirmed {}",
        fake.confirmed()
    );
    bot.shutdown();
    assert_eq!(fake.sends().len(), 30);
    assert!(fake.conflicts().iter().all(|c| c.older == c.newer));
}

/// An update this crate cannot read (a field of the wrong type) is skipped and
/// confirmed; it once failed its whole batch, and every later poll with it.
#[test]
fn an_unreadable_update_is_skipped_and_the_rest_answered() {
    let fake = FakeTelegram::start();
    fake.push_text(7, "before");
    fake.push_update(serde_json::json!({"message": {"message_id": 1, "date": 0,
        "chat": {"id": 7, "type": "private"}, "from": {"id": "not-a-number"}, "text": "x"}}));
    fake.push_text(7, "after");
    let bot = echo_bot(
        "solo",
        Telegram::long_polling(config(&fake.url())).expect("config"),
        None,
    );
    assert!(fake.wait_sends(2, LONG), "{} sent", fake.sends().len());
    assert!(
        fake.wait_all_confirmed(LONG),
        "confirmed {}",
        fake.confirmed()
    );
    bot.shutdown();
    let texts: Vec<String> = fake.sends().into_iter().map(|s| s.text).collect();
    assert_eq!(texts, ["before", "after"]);
}

#[test]
fn only_the_leader_polls_and_a_clean_stop_hands_over_without_overlap() {
    let _serial = serial();
    let fake = FakeTelegram::start();
    let coordinator = Arc::new(MemoryCoordinator::new());
    let mut bots: HashMap<String, Bot> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            let t = Telegram::long_polling(config(&fake.url_for(id))).expect("config");
            let c = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator.clone()));
            (id.to_owned(), echo_bot(id, t, Some(c)))
        })
        .collect();
    let first = fake
        .wait_poll(Instant::now() - LONG, LONG, |_| true)
        .expect("a poll");
    fake.push_text(1, "one");
    assert!(fake.wait_sends(1, LONG));
    let leader = first.label.clone();
    assert!(
        fake.polls().iter().all(|p| p.label == leader),
        "only the leader polls"
    );
    assert!(bots[&leader].leader_token("telegram").is_some());

    let stopped = Instant::now();
    bots.remove(&leader).expect("leader").shutdown();
    let next = fake
        .wait_poll(stopped, LONG, |l| l != leader)
        .expect("a standby polls");
    fake.push_text(1, "two");
    assert!(fake.wait_sends(2, LONG));
    // The stopped leader ended its own long poll with its closing call: the new
    // leader's polls overlapped none of it.
    let cross: Vec<_> = fake
        .conflicts()
        .into_iter()
        .filter(|c| c.older != c.newer)
        .collect();
    assert!(cross.is_empty(), "{cross:?}");
    eprintln!(
        "clean stop, replicas as threads: first poll of the next leader {:?} after the stop began",
        next.start - stopped
    );
    for (_, b) in bots {
        b.shutdown();
    }
    assert_eq!(by_chat(&fake)["1"], ["one", "two"]);
}

#[test]
fn two_pollers_get_409_and_report_it_as_replaced() {
    let fake = FakeTelegram::start();
    // No coordination: each bot polls on its own, as two uncoordinated processes would.
    let a = echo_bot(
        "a",
        Telegram::long_polling(config(&fake.url_for("a"))).expect("c"),
        None,
    );
    let b = echo_bot(
        "b",
        Telegram::long_polling(config(&fake.url_for("b"))).expect("c"),
        None,
    );
    let conflict = fake.wait_conflict(LONG).expect("a 409");
    assert_ne!(conflict.older, conflict.newer);
    // The loser reports the 409 before it polls again.
    let older = conflict.older.clone();
    fake.wait_poll(conflict.at, LONG, |label| label == older)
        .expect("the loser polls again");
    assert!(a.metrics().provider_conflicts + b.metrics().provider_conflicts >= 1);
    a.shutdown();
    b.shutdown();
}

#[test]
fn a_rate_limited_poll_waits_its_retry_after() {
    let fake = FakeTelegram::start();
    fake.rate_limit_every(2);
    let bot = echo_bot(
        "solo",
        Telegram::long_polling(config(&fake.url())).expect("c"),
        None,
    );
    let limited = loop {
        let polls = fake.polls();
        if let Some(p) = polls
            .iter()
            .find(|p| p.end.as_ref().is_some_and(|e| e.1 == PollEnd::RateLimited))
        {
            break p.clone();
        }
        assert!(fake.wait_poll(Instant::now(), LONG, |_| true).is_some());
    };
    let next = fake
        .wait_poll(limited.start + Duration::from_nanos(1), LONG, |_| true)
        .expect("polls again");
    assert!(
        next.start - limited.start >= Duration::from_secs(1),
        "{:?}",
        next.start - limited.start
    );
    bot.shutdown();
}

#[test]
fn replies_and_flow_prompts_carry_keyboards() {
    let fake = FakeTelegram::start();
    let telegram = Telegram::webhook(config(&fake.url())).expect("config");
    let pick = Reply::new("Size?").with_keyboard(Keyboard::reply(vec![vec!["S", "M"], vec!["L"]]));
    let bot = Bot::builder()
        .provider(Arc::new(telegram))
        .flow(
            Flow::new("size")
                .keywords(["order"])
                .ask_for("size", pick)
                .answer("Thanks."),
        )
        .handler(|ctx| {
            let r = Reply::new("Menu").with_keyboard(Keyboard::Inline(vec![vec![
                InlineButton::callback("Order", "order"),
            ]]));
            Ok(ctx.reply_with(&r)?)
        })
        .build()
        .expect("bot");
    let hook = Webhook::without_secret(bot.intake());
    let update = |id: i64, text: &str| {
        json!({"update_id": id, "message": {"message_id": id, "chat": {"id": 7}, "text": text}})
            .to_string()
    };
    assert_eq!(hook.handle(None, update(1, "hello").as_bytes()), 200);
    assert!(fake.wait_sends(1, LONG));
    // The inline button's press comes back as a callback query with its data.
    let press = json!({"update_id": 2, "callback_query": {"id": "q", "from": {"id": 7},
        "data": "order", "message": {"message_id": 1, "chat": {"id": 7}}}});
    assert_eq!(hook.handle(None, press.to_string().as_bytes()), 200);
    assert!(fake.wait_sends(2, LONG));
    assert_eq!(hook.handle(None, update(3, "M").as_bytes()), 200);
    assert!(fake.wait_sends(3, LONG));
    bot.shutdown();
    let sends = fake.sends();
    let texts: Vec<&str> = sends.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["Menu", "Size?", "Thanks."]);
    assert_eq!(
        sends[0].markup,
        Some(json!({"inline_keyboard": [[{"text": "Order", "callback_data": "order"}]]}))
    );
    let markup = sends[1].markup.clone().expect("a reply keyboard");
    assert_eq!(
        markup["keyboard"],
        json!([[{"text": "S"}, {"text": "M"}], [{"text": "L"}]])
    );
    assert_eq!(sends[2].markup, None);
}

#[test]
fn sends_retry_server_errors_and_rate_limits() {
    let fake = FakeTelegram::start();
    let telegram = Telegram::webhook(config(&fake.url())).expect("config");
    fake.fail_next_sends(&[500, 429, 502]);
    telegram.send("42", "hi").expect("sent after retries");
    assert_eq!(fake.send_attempts(), 4);
    assert_eq!(fake.sends().len(), 1);
    // A bad request is not retried.
    fake.fail_next_sends(&[400]);
    let e = telegram.send("42", "x").expect_err("refused");
    assert!(e.to_string().contains("400"), "{e}");
    assert_eq!(fake.send_attempts(), 5);
    assert!(!e.to_string().contains("TEST"), "no token in errors: {e}");
}

#[test]
fn a_send_whose_fence_went_stale_is_refused_and_not_retried() {
    let fake = FakeTelegram::start();
    let telegram = Telegram::webhook(config(&fake.url())).expect("config");
    fake.fail_next_sends(&[500]);
    // Live for the first attempt only, as a turn lost while the send waited.
    let asked = AtomicUsize::new(0);
    let live = || asked.fetch_add(1, Ordering::SeqCst) == 0;
    let fence = Fence::new(&live, Some(9));
    let e = telegram
        .send_reply("42", &Reply::new("late"), &fence)
        .expect_err("stale");
    assert!(e.to_string().contains("stale"), "{e}");
    assert_eq!(fake.send_attempts(), 1);
    assert!(fake.sends().is_empty());
}

#[test]
fn webhook_answers_by_secret_body_and_intake() {
    // Coordinated (memory): without coordination an in-flight duplicate is never
    // asked about again (no renewal thread), so a fast retry would wait forever.
    let c = CoordinationConfig::new(CoordinatorConfig::memory());
    let bot = Bot::builder()
        .coordination(c)
        .handler(|_| Ok(()))
        .build()
        .expect("bot");
    let hook = Webhook::new(bot.intake(), "s3cret-_X").expect("secret");
    let good =
        br#"{"update_id": 5, "message": {"message_id": 1, "chat": {"id": 3}, "text": "hi"}}"#;
    assert_eq!(hook.handle(None, good), 401);
    assert_eq!(hook.handle(Some("s3cret-_Y"), good), 403);
    assert_eq!(hook.handle(Some("s3cret-_X"), b"\xff{"), 400);
    assert_eq!(
        hook.handle(Some("s3cret-_X"), br#"{"no_update_id": 1}"#),
        400
    );
    assert_eq!(
        hook.handle(Some("s3cret-_X"), br#"{"update_id": 6, "poll": {}}"#),
        200
    );
    assert_eq!(hook.handle(Some("s3cret-_X"), good), 200);
    assert_eq!(hook.handle(Some("s3cret-_X"), good), 200, "a retry");
    let intake_after = hook.clone();
    bot.shutdown();
    assert_eq!(intake_after.handle(Some("s3cret-_X"), good), 503);
    for bad in ["", "has space", &"x".repeat(257)] {
        let e = Webhook::new(
            Bot::builder()
                .handler(|_| Ok(()))
                .build()
                .expect("bot")
                .intake(),
            bad,
        )
        .expect_err("refused");
        assert!(e.message().starts_with("secret:"), "{e}");
    }
    let _ = SECRET_HEADER;
}

#[test]
fn a_webhook_retry_to_another_replica_is_answered_once() {
    let fake = FakeTelegram::start();
    let coordinator = Arc::new(MemoryCoordinator::new());
    let replicas: Vec<(Bot, Webhook)> = ["a", "b"]
        .into_iter()
        .map(|id| {
            let c = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator.clone()));
            let t = Telegram::webhook(config(&fake.url_for(id))).expect("config");
            let bot = echo_bot(id, t, Some(c));
            let hook = Webhook::new(bot.intake(), "s").expect("secret");
            (bot, hook)
        })
        .collect();
    for i in 0..10 {
        let body = json!({"update_id": 100 + i, "message": {"message_id": i, "chat": {"id": 5 + i % 2}, "text": format!("t{i}")}}).to_string();
        // Telegram retried (the first answer was lost): each replica gets a copy.
        for (_, hook) in &replicas {
            assert_eq!(hook.handle(Some("s"), body.as_bytes()), 200);
        }
    }
    assert!(fake.wait_sends(10, LONG));
    for (bot, _) in replicas {
        bot.shutdown();
    }
    let sends = fake.sends();
    assert_eq!(sends.len(), 10, "{sends:?}");
    let m = by_chat(&fake);
    assert_eq!(m["5"], ["t0", "t2", "t4", "t6", "t8"]);
    assert_eq!(m["6"], ["t1", "t3", "t5", "t7", "t9"]);
}

#[test]
fn handlers_read_the_update_and_bad_settings_are_refused() {
    let bad = |c: TelegramConfig| {
        Telegram::long_polling(c)
            .expect_err("refused")
            .message()
            .to_owned()
    };
    assert!(bad(TelegramConfig::new("")).starts_with("token:"));
    let e = bad(TelegramConfig::new("12:AB/CD"));
    assert!(e.starts_with("token:") && !e.contains("AB/CD"), "{e}");
    assert!(bad(TelegramConfig::new(TOKEN).with_api_url("ftp://x")).contains("ftp://x"));
    assert!(
        bad(TelegramConfig::new(TOKEN).with_poll_timeout(Duration::from_millis(1500)))
            .starts_with("poll_timeout:")
    );
    let u: Update = serde_json::from_str(r#"{"update_id": 1}"#).expect("parses");
    assert_eq!(u.update_id, 1);
}

/// The `telegram_echo` example against the fake API: it echoes text messages (and
/// nothing else), and SIGTERM stops it cleanly. Needs the example built (`cargo test`
/// builds it; a run filtered to this test file alone may not, and then says so).
#[test]
fn the_echo_example_answers_and_stops_on_sigterm() {
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent()?.parent().map(|d| d.to_owned()))
    else {
        return;
    };
    let bin = dir.join("examples").join("telegram_echo");
    if !bin.exists() {
        eprintln!(
            "{} not built; skipped (cargo test builds it)",
            bin.display()
        );
        return;
    }
    let fake = FakeTelegram::start();
    let mut child = std::process::Command::new(&bin)
        .args([
            "--token",
            TOKEN,
            "--api-url",
            &fake.url(),
            "--replica-id",
            "echo-1",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the example");
    fake.push_update(json!({"message": {"message_id": 1, "chat": {"id": 9}, "sticker": {}}}));
    fake.push_text(9, "hello");
    assert!(fake.wait_sends(1, LONG));
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let status = child.wait().expect("exits");
    assert!(status.success(), "{status:?}");
    let sends = fake.sends();
    assert_eq!(sends.len(), 1, "the sticker is not echoed");
    assert_eq!(
        (sends[0].chat.clone(), sends[0].text.as_str()),
        (json!(9), "hello")
    );
}
