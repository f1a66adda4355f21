//! The conformance suite against `RedisCoordinator` and real `redis-server` processes.
#![cfg(feature = "redis")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::RedisServer;

struct Redis {
    server: RedisServer,
    coordinator: Arc<RedisCoordinator>,
}

impl conformance::Harness for Redis {
    fn start(ttl: Duration) -> Self {
        let server = RedisServer::start();
        let options = RedisOptions::new(server.url()).with_lease_ttl(ttl);
        let coordinator = Arc::new(RedisCoordinator::connect(options).expect("connect"));
        Redis {
            server,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.server.keys_without_ttl().len()
    }
}

conformance::suite!(Redis);

/// The library's batch function (several threads' calls to one server folded into one
/// `FCALL`) runs each operation as its own call would: one that fails (here on a key of
/// the wrong type) answers with its error, and the operations before and after it run
/// and answer as alone.
#[test]
fn a_batch_call_isolates_each_operation() {
    let server = RedisServer::start();
    let options = RedisOptions::new(server.url()).with_lease_ttl(Duration::from_secs(10));
    let _coordinator = RedisCoordinator::connect(options).expect("connect");
    let mut con = server.connection();
    let libs: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut con)
        .expect("FUNCTION LIST");
    let text = format!("{libs:?}");
    let tag = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("botmesh_"))
        .and_then(|w| w.get(..20))
        .expect("the library is loaded")
        .to_owned();
    // chat b's state key holds a string: its enqueue fails on HMGET (WRONGTYPE).
    let _: () = redis::cmd("SET")
        .arg("botmesh:{b}:s")
        .arg("x")
        .query(&mut con)
        .expect("SET");
    let chats = ["a", "b", "c"];
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{tag}_batch")).arg(2 * chats.len());
    for chat in chats {
        cmd.arg(format!("botmesh:{{{chat}}}:s"))
            .arg(format!("botmesh:{{{chat}}}:q"));
    }
    cmd.arg(chats.len());
    for _ in chats {
        // function, key count, argument count (enqueue takes 8)
        cmd.arg(format!("{tag}_enqueue")).arg(2).arg(8);
    }
    for chat in chats {
        cmd.arg(chat)
            .arg("1:r")
            .arg(10_000)
            .arg(3_600_000)
            .arg("botmesh:{wake}:")
            .arg(3_600_000)
            .arg("")
            .arg(0);
    }
    // Read raw: `query` turns an error anywhere in the reply into the reply's error.
    con.send_packed_command(&cmd.get_packed_command())
        .expect("send");
    let reply = con.recv_response().expect("the batch call answers");
    let redis::Value::Array(replies) = reply else {
        panic!("an array of replies, not {reply:?}");
    };
    assert_eq!(replies.len(), 3, "one reply per operation");
    let first = |v: &redis::Value| match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    };
    assert_eq!(first(&replies[0]), "granted");
    assert!(
        matches!(&replies[1], redis::Value::ServerError(e) if format!("{e:?}").contains("WRONGTYPE")),
        "the failing operation answers with its own error: {:?}",
        replies[1]
    );
    assert_eq!(first(&replies[2]), "granted", "the operation after it ran");
    for chat in ["a", "c"] {
        let holder: Option<String> = redis::cmd("HGET")
            .arg(format!("botmesh:{{{chat}}}:s"))
            .arg("h")
            .query(&mut con)
            .expect("HGET");
        assert!(
            holder.is_some_and(|h| h.ends_with(",1:r")),
            "chat {chat} is held by 1:r"
        );
    }
}
