//! Finding the primary through Redis Sentinel: `SENTINEL GET-MASTER-ADDR-BY-NAME` on
//! each sentinel in turn, first answer wins; the target then checks with `ROLE` that
//! the named node calls itself the primary (a sentinel may name a replica that is
//! being promoted). Asked at connect and again whenever a call finds its connection
//! broken or the server `READONLY` (a demoted primary), so a failover is followed.
//!
//! # Why not the `redis` crate's `Sentinel`
//!
//! Its sync client opens sentinel and node connections without a timeout, so one
//! paused sentinel or half-open primary would hang a worker; here every connection
//! and read has the command timeout.

use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use super::options::SentinelOptions;
use super::url::{describe_at, host_port};
use crate::coordinator::BackendError;

/// The sentinels and the service, parsed once.
pub(super) struct Lookup {
    sentinels: Vec<ConnectionInfo>,
    service: String,
}

impl Lookup {
    /// # Errors
    /// A sentinel URL that does not parse (named by its place in the list).
    pub(super) fn new(s: &SentinelOptions) -> Result<Self, BackendError> {
        let mut sentinels = Vec::with_capacity(s.urls.len());
        for (i, url) in s.urls.iter().enumerate() {
            super::url::check_parses(&format!("sentinel.urls[{i}]"), url)
                .map_err(BackendError::new)?;
            let info = url.as_str().into_connection_info().map_err(|e| {
                BackendError::new(format!("sentinel.urls[{i}]: not a usable Redis URL ({e})"))
            })?;
            sentinels.push(info);
        }
        Ok(Lookup {
            sentinels,
            service: s.service.clone(),
        })
    }

    /// `sentinel <service> via host:port,…`, for messages.
    pub(super) fn label(&self) -> String {
        let at: Vec<String> = self
            .sentinels
            .iter()
            .map(|i| {
                let (h, p) = host_port(i.addr());
                format!("{h}:{p}")
            })
            .collect();
        format!("sentinel service {:?} via {}", self.service, at.join(","))
    }

    /// The settings for the data nodes: the first sentinel's scheme (TLS or not),
    /// without the sentinel's own credentials, with `password` if given.
    pub(super) fn base(&self, password: Option<&str>) -> ConnectionInfo {
        let first = self.sentinels[0].clone();
        let redis = match password {
            Some(pw) => RedisConnectionInfo::default().set_password(pw),
            None => RedisConnectionInfo::default(),
        };
        first.set_redis_settings(redis)
    }

    /// The primary's host and port as the first sentinel that knows the service
    /// says.
    ///
    /// # Errors
    /// When no sentinel answers, or none knows the service.
    pub(super) fn primary(&self, timeout: Duration) -> Result<(String, u16), BackendError> {
        let mut last = String::from("no sentinel");
        for info in &self.sentinels {
            let (h, p) = host_port(info.addr());
            let at = format!("{h}:{p}");
            let answer = redis::Client::open(info.clone())
                .and_then(|c| c.get_connection_with_timeout(timeout))
                .and_then(|mut con| {
                    con.set_read_timeout(Some(timeout))?;
                    con.set_write_timeout(Some(timeout))?;
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(&self.service)
                        .query::<Option<(String, u16)>>(&mut con)
                });
            match answer {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => {
                    last = format!(
                        "sentinel at {at} does not know the service {:?} (sentinel.service)",
                        self.service
                    );
                }
                Err(e) => last = describe_at(&format!("sentinel {at}"), timeout, &e).to_string(),
            }
        }
        Err(BackendError::new(format!(
            "cannot find the primary of {:?} through the sentinels: {last}",
            self.service
        )))
    }
}
