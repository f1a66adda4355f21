//! Unit tests of `node.rs`: group commit with fake senders, and folding on a real
//! `redis-server`.

use super::*;
use std::sync::mpsc;

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

fn fcall(function: &str, keys: &[&str], args: &[&str]) -> Vec<u8> {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.get_packed_command()
}

fn texts(packed: &[u8], parts: &[Range<usize>]) -> Vec<String> {
    parts
        .iter()
        .map(|r| String::from_utf8_lossy(&packed[r.clone()]).into_owned())
        .collect()
}

#[test]
fn an_fcall_is_split_into_its_arguments_and_nothing_else_is() {
    let p = fcall("f", &["k1", "k2"], &["a", "", "b\r\nc"]);
    let parts = fcall_parts(&p).expect("one FCALL");
    assert_eq!(texts(&p, &parts), ["f", "2", "k1", "k2", "a", "", "b\r\nc"]);
    // Two commands, another command, a key count past the arguments, cut short.
    let mut two = p.clone();
    two.extend_from_slice(&p);
    assert!(fcall_parts(&two).is_none());
    assert!(fcall_parts(&redis::cmd("GET").arg("k").get_packed_command()).is_none());
    assert!(fcall_parts(&fcall("f", &[], &[])[..]).is_some());
    let mut cmd = redis::cmd("FCALL");
    cmd.arg("f").arg(3).arg("k");
    assert!(fcall_parts(&cmd.get_packed_command()).is_none());
    assert!(fcall_parts(&p[..p.len() - 1]).is_none());
    assert!(fcall_parts(b"").is_none());
}

#[test]
fn folded_calls_keep_their_order_keys_and_arguments() {
    let call = |packed: Vec<u8>| {
        Arc::new(Call {
            parts: fcall_parts(&packed),
            packed,
            replies: 1,
            outcome: Mutex::new(None),
        })
    };
    let calls = [
        call(fcall("f", &["a1", "a2"], &["x"])),
        call(redis::cmd("PING").get_packed_command()),
        call(fcall("g", &["b1"], &["y", "z"])),
    ];
    let packed = fold_calls("batch", &calls).get_packed_command();
    let parts = fcall_parts(&packed).expect("one FCALL");
    assert_eq!(
        texts(&packed, &parts),
        [
            "batch", "3", "a1", "a2", "b1", "2", "f", "2", "1", "g", "1", "2", "x", "y", "z"
        ]
    );
}

#[test]
fn a_batch_reply_is_split_per_operation_and_a_whole_error_goes_to_each() {
    let items = vec![Value::Int(1), Value::Nil, Value::Int(3)];
    let split = split_folded(Ok(Value::Array(items)), 3);
    assert!(matches!(
        split.as_slice(),
        [Ok(Value::Int(1)), Ok(Value::Nil), Ok(Value::Int(3))]
    ));
    let short = split_folded(Ok(Value::Array(vec![Value::Int(1)])), 2);
    assert_eq!(short.len(), 2);
    assert!(short.iter().all(Result::is_err));
    let broken = split_folded(Err(lost_earlier()), 2);
    assert_eq!(broken.len(), 2);
    assert!(broken.iter().all(|r| r.as_ref().is_err_and(is_transient)));
}

/// Two calls that queue behind a batch on a real server go out as one call of the
/// batch function, and each caller gets its own answer.
#[test]
fn calls_queued_together_are_folded_into_one_function_call() {
    let server = redis_server::RedisServer::start();
    let client = Client::open(server.url()).expect("client");
    let scripts = super::super::scripts::Scripts::new();
    let mut con = client.get_connection().expect("connect");
    scripts.load(&mut con).expect("load the library");
    let node = Arc::new(Node {
        addr: format!("127.0.0.1:{}", server.port()),
        client,
        pool: Mutex::new(Vec::new()),
        batch: Combiner::default(),
    });
    let t = Duration::from_secs(5);
    let enqueue = |chat: &str, ticket: &str| {
        let (s, q) = (
            format!("botmesh:{{{chat}}}:s"),
            format!("botmesh:{{{chat}}}:q"),
        );
        let args = [chat, ticket, "10000", "3600000", "w:", "3600000", "", "0"];
        fcall(&scripts.enqueue, &[&s, &q], &args)
    };
    let fcalls = |con: &mut Connection| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(con)
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let before = fcalls(&mut con);
    let (hold, held) = mpsc::channel::<()>();
    let (entered, sending) = mpsc::channel::<()>();
    let granted_to = |outcome: Outcome| -> String {
        let replies = outcome.expect("written");
        match replies.as_slice() {
            [Ok(Value::Array(v))] => match (v.first(), v.get(1)) {
                (Some(Value::BulkString(tag)), Some(Value::BulkString(t)))
                    if tag.as_slice() == b"granted" =>
                {
                    String::from_utf8_lossy(t).into_owned()
                }
                other => panic!("not a grant: {other:?}"),
            },
            other => panic!("unexpected replies {other:?}"),
        }
    };
    std::thread::scope(|s| {
        let (node1, first) = (node.clone(), enqueue("a", "1:r"));
        let fold = Some(scripts.batch.as_str());
        let first = s.spawn(move || {
            let parts = fcall_parts(&first);
            node1.batch.run(first, 1, parts, |calls| {
                let _ = entered.send(());
                let _ = held.recv();
                node1.send_batch(calls, fold, t, t)
            })
        });
        sending.recv().expect("test step");
        let others: Vec<_> = [("b", "2:r"), ("c", "3:r")]
            .into_iter()
            .map(|(chat, ticket)| {
                let (n, p) = (node.clone(), enqueue(chat, ticket));
                s.spawn(move || n.exchange(p, 1, fold, t, t))
            })
            .collect();
        while queued(&node.batch) < 2 {
            std::thread::yield_now();
        }
        hold.send(()).expect("test step");
        assert_eq!(granted_to(first.join().expect("test step")), "1:r");
        for (h, ticket) in others.into_iter().zip(["2:r", "3:r"]) {
            assert_eq!(granted_to(h.join().expect("test step")), ticket);
        }
    });
    // The first call alone, then one call carrying the other two (plus this INFO).
    assert_eq!(fcalls(&mut con) - before, 2);
}

/// A sender that answers each call with its pipeline's first byte, and tells
/// which calls it sent together.
fn answer(calls: &[Arc<Call>], batches: &mpsc::Sender<Vec<u8>>) -> bool {
    let firsts: Vec<u8> = calls.iter().map(|c| c.packed[0]).collect();
    for c in calls {
        *c.outcome.lock() = Some(Ok(vec![Ok(Value::Int(i64::from(c.packed[0])))]));
    }
    let _ = batches.send(firsts);
    true
}

fn queued(c: &Combiner) -> usize {
    c.queue.lock().waiting.len()
}

#[test]
fn calls_queued_behind_a_batch_go_out_together_and_get_their_own_replies() {
    let combiner = Arc::new(Combiner::default());
    let (batches, sent) = mpsc::channel();
    let (hold, held) = mpsc::channel::<()>();
    let (entered, sending) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let first = {
            let (c, b) = (combiner.clone(), batches.clone());
            s.spawn(move || {
                c.run(vec![1], 1, None, |calls| {
                    let _ = entered.send(());
                    // The wire is busy until the test lets it go.
                    let _ = held.recv();
                    answer(calls, &b)
                })
            })
        };
        // The first call is on the wire: the next ones queue.
        sending.recv().expect("test step");
        let others: Vec<_> = [2u8, 3, 4]
            .into_iter()
            .map(|k| {
                let (c, b) = (combiner.clone(), batches.clone());
                s.spawn(move || c.run(vec![k], 1, None, |calls| answer(calls, &b)))
            })
            .collect();
        while queued(&combiner) < 3 {
            std::thread::yield_now();
        }
        hold.send(()).expect("test step");
        let got = |h: std::thread::ScopedJoinHandle<'_, Outcome>| {
            let replies = h.join().expect("test step").expect("test step");
            match replies.as_slice() {
                [Ok(Value::Int(k))] => *k,
                other => panic!("unexpected replies {other:?}"),
            }
        };
        assert_eq!(got(first), 1);
        for (h, k) in others.into_iter().zip([2, 3, 4]) {
            assert_eq!(got(h), k, "a call got another call's reply");
        }
    });
    drop(batches);
    let batches: Vec<Vec<u8>> = sent.iter().collect();
    // The three queued calls went out as one batch, in the order they queued.
    assert_eq!(batches.len(), 2, "batches: {batches:?}");
    assert_eq!(batches[0], vec![1]);
    let mut second = batches[1].clone();
    second.sort_unstable();
    assert_eq!(second, vec![2, 3, 4]);
}

#[test]
fn calls_queued_behind_a_broken_batch_fail_unsent() {
    let combiner = Arc::new(Combiner::default());
    let (hold, held) = mpsc::channel::<()>();
    let (entered, sending) = mpsc::channel::<()>();
    let sent_again = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let first = {
            let c = combiner.clone();
            s.spawn(move || {
                c.run(vec![1], 1, None, |calls| {
                    let _ = entered.send(());
                    let _ = held.recv();
                    for c in calls {
                        *c.outcome.lock() = Some(Err(lost_earlier()));
                    }
                    false
                })
            })
        };
        sending.recv().expect("test step");
        let next = {
            let (c, sent_again) = (combiner.clone(), &sent_again);
            s.spawn(move || {
                c.run(vec![2], 1, None, |_| {
                    sent_again.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    true
                })
            })
        };
        while queued(&combiner) < 1 {
            std::thread::yield_now();
        }
        hold.send(()).expect("test step");
        assert!(first.join().expect("test step").is_err());
        let err = next.join().expect("test step").expect_err("an error");
        assert!(err.to_string().contains("not sent"), "{err}");
    });
    assert_eq!(sent_again.into_inner(), 0, "the queued call was sent");
}

#[test]
fn a_sender_that_fails_every_call_ends_each_with_an_error_and_frees_the_queue() {
    let combiner = Combiner::default();
    // A sender that fills nothing: each call still ends, with the loss error.
    let outcome = combiner.run(vec![1], 1, None, |_| true);
    assert!(outcome.is_err(), "{outcome:?}");
    // The queue is open for the next call.
    let next = combiner.run(vec![7], 1, None, |calls| {
        *calls[0].outcome.lock() = Some(Ok(vec![Ok(Value::Int(7))]));
        true
    });
    assert!(matches!(
        next.expect("test step").as_slice(),
        [Ok(Value::Int(7))]
    ));
}

#[test]
fn slots_follow_the_cluster_specification() {
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(slot_of(b"123456789"), 0x31C3);
    assert_eq!(slot_of(b"foo"), 12182);
    assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
    // An empty tag hashes the whole key.
    assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
    assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
    assert_eq!(slot_of(b"p:{chat-1}:h"), slot_of(b"p:{chat-1}:m:msg{9}"));
}
