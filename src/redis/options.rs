//! The settings of a `RedisCoordinator`: which servers (one, a cluster's seed nodes, or
//! a primary found through Sentinel), TLS files, timeouts, and their checks.

use std::path::PathBuf;
use std::time::Duration;

use crate::coordinator::{DEFAULT_DEDUP_IDS, DEFAULT_DEDUP_WINDOW, DEFAULT_LEASE_TTL};

use super::url::read_env;

/// Settings of a [`RedisCoordinator`](super::RedisCoordinator).
///
/// Exactly one of [`url`](Self::url) (one server), [`cluster`](Self::cluster) (Redis
/// Cluster seed nodes) or [`sentinel`](Self::sentinel) (a primary looked up through
/// Sentinel) says where Redis is; [`RedisCoordinator::connect`] refuses a mix.
///
/// [`RedisCoordinator::connect`]: super::RedisCoordinator::connect
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` with the `tls`
    /// feature) of a standalone server; empty when [`cluster`](Self::cluster) or
    /// [`sentinel`](Self::sentinel) is used. Never logged.
    pub url: String,
    /// Redis Cluster seed nodes (`redis://host:port` each; any live one is enough, the
    /// others are found from it); empty for a standalone server. Never logged.
    pub cluster: Vec<String>,
    /// Sentinel mode: the sentinels and the monitored service whose primary to use.
    pub sentinel: Option<SentinelOptions>,
    /// TLS trust and client identity files, for `rediss://` (feature `tls`).
    pub tls: TlsOptions,
    /// Prefix of every key and channel, so bots can share a server. No `{` or `}`.
    /// Default `botmesh`.
    pub key_prefix: String,
    /// TTL of every lease; renewed every TTL/3. Default 10 s; at least 10 ms.
    pub lease_ttl: Duration,
    /// Duplicate-suppression window; zero turns it off. Default 10 min.
    pub dedup_window: Duration,
    /// How many handled message ids each chat remembers at least (1 to
    /// [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS), default
    /// [`DEFAULT_DEDUP_IDS`], 64; `dedupIds` in files): a
    /// chat's state hash keeps its newest `dedup_ids` to 1.5 × `dedup_ids` handled
    /// ids. Replicas sharing a server may differ; each release applies its own.
    pub dedup_ids: usize,
    /// How many replicas of a chat's primary must hold a write before it counts
    /// (`waitReplicas` in files; 0 to [`MAX_WAIT_REPLICAS`], default 0: off). With
    /// `n > 0` every enqueue, release, renewal, re-check, cancel and checkpoint write
    /// is followed, in the same pipeline, by `WAIT n ms` (ms: half the command
    /// timeout), and a pushed grant is confirmed with one renewal before use:
    /// an enqueue the replicas did not acknowledge in time fails (the message is not
    /// taken in), a renewal, re-check or confirmation counts as not made (the lease
    /// runs out at its known end, a waiter keeps waiting), a checkpoint write
    /// fails. So a failover (Sentinel or Cluster) that promotes a replica with every
    /// acknowledged write loses no grant, lease extension or accepted message. It
    /// costs no round trip on the uncontended path, one more round trip for a grant
    /// pushed from another replica, and the replicas' acknowledgement time on every
    /// call; with fewer than `n` replicas connected every such call fails, and
    /// [`RedisCoordinator::connect`](super::RedisCoordinator::connect) refuses to start
    /// when a primary has fewer than `n` connected then.
    /// Asynchronous replication and `WAIT` are Redis' own (see the `WAIT` command);
    /// the lost-write window it closes is described in the README's *Scaling out*.
    pub wait_replicas: usize,
    /// Connect, read and write timeout of every Redis call. Default 2 s, or a third of
    /// the lease TTL when that is shorter (set through
    /// [`with_lease_ttl`](RedisOptions::with_lease_ttl)); must stay under half the
    /// lease TTL (see [`RedisCoordinator::connect`]). In cluster and Sentinel mode it
    /// also bounds the retries after a redirection or failover: no new attempt starts
    /// once it has run out.
    ///
    /// [`RedisCoordinator::connect`]: super::RedisCoordinator::connect
    pub command_timeout: Duration,
    /// The password, given apart from the URL (from an environment variable: see
    /// [`RedisOptions::with_password_from_env`], or `passwordEnv` in files); it takes
    /// the place of any password in `url` (and in every cluster or sentinel URL).
    /// `None`: the URL's own, if any. Never logged.
    pub password: Option<String>,
}

/// Where the sentinels are and which monitored primary to use.
#[derive(Clone)]
pub struct SentinelOptions {
    /// `redis://host:port` of each sentinel (at least one). Never logged.
    pub urls: Vec<String>,
    /// The service name the sentinels monitor (`sentinel monitor <name> …`).
    pub service: String,
}

/// TLS files for `rediss://` connections (feature `tls`); all optional: without a CA
/// file the system's trusted roots are used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// A PEM file of the certificate authorities to trust for the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate, for servers that ask for one (`tls-auth-clients`);
    /// needs [`client_key`](Self::client_key) too.
    pub client_cert: Option<PathBuf>,
    /// The PEM private key of [`client_cert`](Self::client_cert).
    pub client_key: Option<PathBuf>,
}

impl std::fmt::Debug for SentinelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelOptions")
            .field("urls", &format_args!("<{} sentinels>", self.urls.len()))
            .field("service", &self.service)
            .finish()
    }
}

impl TlsOptions {
    /// Whether any TLS file is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &"<redacted>")
            .field("cluster", &format_args!("<{} nodes>", self.cluster.len()))
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|s| (s.urls.len(), &s.service)),
            )
            .field("tls", &self.tls)
            .field("key_prefix", &self.key_prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("dedup_window", &self.dedup_window)
            .field("dedup_ids", &self.dedup_ids)
            .field("wait_replicas", &self.wait_replicas)
            .field("command_timeout", &self.command_timeout)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The largest accepted [`RedisOptions::wait_replicas`]: 100 (a guard against a typo;
/// a primary with more replicas than that is not a set-up `WAIT` on every call suits).
pub const MAX_WAIT_REPLICAS: usize = 100;

/// Checks a `wait_replicas` setting; the error names `field` and the value.
pub(crate) fn check_wait_replicas(field: &str, n: usize) -> Result<(), String> {
    if n > MAX_WAIT_REPLICAS {
        return Err(format!(
            "{field}: {n} is out of range; expected how many replicas must acknowledge each \
             write, from 0 (off) to {MAX_WAIT_REPLICAS}, such as 1"
        ));
    }
    Ok(())
}

/// The default command timeout: 2 s.
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses a command timeout that cannot work with the lease TTL: a renewal that
/// times out is retried once on a fresh connection, so it may take twice the command
/// timeout; when that reaches the TTL, one slow renewal loses every lease even though
/// Redis came back in time. The error text starts with the field name (`commandTimeoutMs`).
pub(crate) fn check_timeout_fits_lease(o: &RedisOptions) -> Result<(), String> {
    if o.command_timeout.saturating_mul(2) >= o.lease_ttl {
        return Err(format!(
            "commandTimeoutMs: {} is too long for leaseTtlMs {}: a renewal that times out \
             and is retried takes up to twice the command timeout, which must stay under the \
             lease TTL; use a command timeout under half the TTL",
            humantime::format_duration(o.command_timeout),
            humantime::format_duration(o.lease_ttl)
        ));
    }
    Ok(())
}

/// Which servers the options point at, once checked.
pub(super) enum Mode<'a> {
    Single(&'a str),
    Cluster(&'a [String]),
    Sentinel(&'a SentinelOptions),
}

/// Checks that exactly one way of finding Redis is given, and that every URL of it
/// parses (with TLS only when the `tls` feature is built). The message names the
/// fields (`url`, `cluster`, `sentinel.urls`, `sentinel.service`) and never shows a
/// password.
pub(crate) fn check_mode(o: &RedisOptions) -> Result<(), String> {
    mode(o).map(|_| ())
}

pub(super) fn mode(o: &RedisOptions) -> Result<Mode<'_>, String> {
    let given: Vec<&str> = [
        (!o.url.is_empty()).then_some("url"),
        (!o.cluster.is_empty()).then_some("cluster"),
        o.sentinel.is_some().then_some("sentinel"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if given.len() > 1 {
        return Err(format!(
            "{}: more than one way to reach Redis is given; give one of url (a single \
             server), cluster (seed nodes) or sentinel (sentinels and a service)",
            given.join(", ")
        ));
    }
    let mode = if let Some(s) = &o.sentinel {
        if s.urls.is_empty() {
            return Err(
                "sentinel.urls: the list is empty; give at least one sentinel, such as \
                 [\"redis://127.0.0.1:26379\"]"
                    .to_owned(),
            );
        }
        if s.service.trim().is_empty() {
            return Err(format!(
                "sentinel.service: {:?} is empty; give the name the sentinels monitor, \
                 such as \"mymaster\"",
                s.service
            ));
        }
        for (i, url) in s.urls.iter().enumerate() {
            check_one(&format!("sentinel.urls[{i}]"), url)?;
        }
        Mode::Sentinel(s)
    } else if !o.cluster.is_empty() {
        for (i, url) in o.cluster.iter().enumerate() {
            check_one(&format!("cluster[{i}]"), url)?;
            if url.contains("unix:") {
                return Err(format!(
                    "cluster[{i}]: a Unix socket cannot be a cluster node; give redis://host:port"
                ));
            }
            // Redis Cluster has database 0 only (`SELECT` is refused there).
            let db = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map(|c| c.redis_settings().db())
                .unwrap_or(0);
            if db != 0 {
                return Err(format!(
                    "cluster[{i}]: database {db} was asked for, but Redis Cluster has database \
                     0 only; drop the /{db} from the URL (use keyPrefix to share a cluster)"
                ));
            }
        }
        Mode::Cluster(&o.cluster)
    } else if o.url.is_empty() {
        return Err(
            "url: missing; give the Redis server's address (url), Redis Cluster seed nodes \
             (cluster) or sentinels (sentinel)"
                .to_owned(),
        );
    } else {
        check_one("url", &o.url)?;
        Mode::Single(&o.url)
    };
    if o.tls.is_set() && !cfg!(feature = "tls") {
        return Err(
            "tls: TLS files are given but botmesh was built without its `tls` feature; \
             build with --features tls"
                .to_owned(),
        );
    }
    if o.tls.client_cert.is_some() != o.tls.client_key.is_some() {
        return Err(
            "tls.clientCert, tls.clientKey: give both (a client certificate and its key) or neither"
                .to_owned(),
        );
    }
    Ok(mode)
}

/// One URL: it parses, and `rediss://` only with the `tls` feature.
fn check_one(field: &str, url: &str) -> Result<(), String> {
    let tls = url
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"));
    if tls && !cfg!(feature = "tls") {
        return Err(format!(
            "{field}: a rediss:// (TLS) URL, but botmesh was built without its `tls` \
             feature; build with --features tls or use redis://"
        ));
    }
    super::url::check_parses(field, url)
}

impl RedisOptions {
    /// Options for the standalone server at `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            cluster: Vec::new(),
            sentinel: None,
            tls: TlsOptions::default(),
            key_prefix: "botmesh".into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            dedup_window: DEFAULT_DEDUP_WINDOW,
            dedup_ids: DEFAULT_DEDUP_IDS,
            wait_replicas: 0,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            password: None,
        }
    }

    /// Options for a Redis Cluster reached through the seed nodes `nodes`
    /// (`redis://host:port` each), with every default.
    pub fn cluster<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        let mut o = Self::new("");
        o.cluster = nodes.into_iter().map(Into::into).collect();
        o
    }

    /// Options for the primary of `service`, looked up through the sentinels at
    /// `urls` (`redis://host:port` each) and followed across failovers.
    pub fn sentinel<S: Into<String>>(
        urls: impl IntoIterator<Item = S>,
        service: impl Into<String>,
    ) -> Self {
        let mut o = Self::new("");
        o.sentinel = Some(SentinelOptions {
            urls: urls.into_iter().map(Into::into).collect(),
            service: service.into(),
        });
        o
    }

    /// Options for the URL held by the environment variable `var` (so the URL, with
    /// its password, stays out of files and command lines), with every default.
    ///
    /// # Errors
    /// A message naming the variable (never its value) when it is unset, empty or not
    /// UTF-8.
    pub fn from_env(var: &str) -> Result<Self, String> {
        Ok(Self::new(read_env("urlEnv", var)?))
    }

    /// Sets the password, taking the place of any password in the URL.
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets the password from the environment variable `var`.
    ///
    /// # Errors
    /// A message naming the variable (never its value) when it is unset, empty or not
    /// UTF-8.
    pub fn with_password_from_env(self, var: &str) -> Result<Self, String> {
        Ok(self.with_password(read_env("passwordEnv", var)?))
    }

    /// Sets the PEM file of the certificate authorities trusted for `rediss://`
    /// servers (feature `tls`; without it [`RedisCoordinator::connect`] refuses).
    ///
    /// [`RedisCoordinator::connect`]: super::RedisCoordinator::connect
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca_file = Some(path.into());
        self
    }

    /// Sets a PEM client certificate and its key, for servers that check clients.
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls.client_cert = Some(cert.into());
        self.tls.client_key = Some(key.into());
        self
    }

    /// Sets the key prefix.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the lease TTL. A command timeout still at its default is shortened to a
    /// third of the TTL if that is less, so a short TTL works without more settings
    /// (a timeout set with [`with_command_timeout`](Self::with_command_timeout) is kept
    /// and checked).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        if self.command_timeout == DEFAULT_COMMAND_TIMEOUT {
            self.command_timeout = DEFAULT_COMMAND_TIMEOUT.min(ttl / 3);
        }
        self
    }

    /// Sets the duplicate-suppression window.
    pub fn with_dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Sets [`wait_replicas`](Self::wait_replicas), checked at
    /// [`RedisCoordinator::connect`](super::RedisCoordinator::connect).
    pub fn with_wait_replicas(mut self, n: usize) -> Self {
        self.wait_replicas = n;
        self
    }

    /// Sets [`dedup_ids`](Self::dedup_ids), checked at
    /// [`connect`](super::RedisCoordinator::connect).
    pub fn with_dedup_ids(mut self, n: usize) -> Self {
        self.dedup_ids = n;
        self
    }

    /// Sets the timeout of every Redis call.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(o: &RedisOptions) -> String {
        check_mode(o).expect_err("refused")
    }

    #[test]
    fn modes_are_checked_with_the_field_named() {
        assert!(check_mode(&RedisOptions::new("redis://h:1")).is_ok());
        assert!(check_mode(&RedisOptions::cluster(["redis://h:1", "redis://h:2"])).is_ok());
        assert!(check_mode(&RedisOptions::sentinel(["redis://h:26379"], "m")).is_ok());
        assert!(err(&RedisOptions::new("")).starts_with("url: missing"));
        let both = RedisOptions {
            cluster: vec!["redis://h:2".into()],
            ..RedisOptions::new("redis://h:1")
        };
        assert!(err(&both).starts_with("url, cluster: more than one"));
        assert!(
            err(&RedisOptions::cluster(["redis://h:1", "redis://h:x"])).starts_with("cluster[1]: ")
        );
        assert!(
            err(&RedisOptions::sentinel(Vec::<String>::new(), "m")).starts_with("sentinel.urls: ")
        );
        assert!(
            err(&RedisOptions::sentinel(["redis://h:1"], "")).starts_with("sentinel.service: \"\"")
        );
        let half = RedisOptions {
            tls: TlsOptions {
                client_cert: Some("/c.pem".into()),
                ..TlsOptions::default()
            },
            ..RedisOptions::new("redis://h:1")
        };
        let e = err(&half);
        // Without the feature, any TLS file is refused first.
        let why = if cfg!(feature = "tls") {
            "both"
        } else {
            "`tls` feature"
        };
        assert!(e.starts_with("tls") && e.contains(why), "{e}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_is_refused_clearly() {
        let e = err(&RedisOptions::new("rediss://h:6380"));
        assert!(
            e.starts_with("url: a rediss:// (TLS) URL") && e.contains("`tls` feature"),
            "{e}"
        );
        let e = err(&RedisOptions::cluster(["redis://h:1", "rediss://h:2"]));
        assert!(e.starts_with("cluster[1]: a rediss://"), "{e}");
        let e = err(&RedisOptions::new("redis://h:1").with_ca_file("/ca.pem"));
        assert!(e.starts_with("tls: ") && e.contains("`tls` feature"), "{e}");
    }
}
