//! The coordinators a replay runs over: one shared `MemoryCoordinator`, or a
//! `RedisCoordinator` per replica (each with its own connection pool and subscriber,
//! as separate processes would have).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use botmesh::{Coordinator, MemoryCoordinator};

use crate::args::Options;

/// The Redis settings of a run, resolved once (the parent hands the same ones to its
/// replica processes).
#[derive(Clone, Debug)]
pub struct RedisSettings {
    /// The server's URL (never printed: it may hold a password); empty with
    /// `cluster` or `sentinel`.
    pub url: String,
    /// Redis Cluster seed nodes; empty: not a cluster.
    pub cluster: Vec<String>,
    /// Sentinels and the service they monitor; empty: no Sentinel.
    pub sentinel: Vec<String>,
    /// The sentinels' service.
    pub service: Option<String>,
    /// The key prefix of this run.
    pub key_prefix: String,
    /// The lease TTL.
    pub lease_ttl: Duration,
    /// Handled message ids each chat remembers at least.
    pub dedup_ids: usize,
    /// Replicas that must acknowledge each turn write.
    pub wait_replicas: usize,
}

impl RedisSettings {
    /// Which servers the run uses, for its summary: `one server`, `cluster (2 seed
    /// nodes)` or `sentinel service "mymaster"`, and `wait_replicas N` when set.
    pub fn describe(&self) -> String {
        let servers = if !self.cluster.is_empty() {
            format!("cluster ({} seed nodes)", self.cluster.len())
        } else if let Some(service) = &self.service {
            format!("sentinel service {service:?}")
        } else {
            "one server".to_owned()
        };
        match self.wait_replicas {
            0 => servers,
            n => format!("{servers}, wait_replicas {n}"),
        }
    }

    /// The settings `o` asks for; `None` for the memory backend. Without
    /// `--key-prefix`, a fresh prefix `replay-<pid>-<nanos>`, so that runs on one
    /// server never see each other's keys (every key botmesh leaves expires on its own).
    pub fn of(o: &Options) -> Option<RedisSettings> {
        if o.backend != "redis" {
            return None;
        }
        let url = o.redis_url.clone().unwrap_or_default();
        let key_prefix = o.key_prefix.clone().unwrap_or_else(|| {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("replay-{}-{nanos}", std::process::id())
        });
        Some(RedisSettings {
            url,
            cluster: o.redis_cluster.clone(),
            sentinel: o.redis_sentinel.clone(),
            service: o.sentinel_service.clone(),
            key_prefix,
            lease_ttl: o.lease_ttl.unwrap_or(botmesh::DEFAULT_LEASE_TTL),
            dedup_ids: o.dedup_ids.unwrap_or(botmesh::DEFAULT_DEDUP_IDS),
            wait_replicas: o.wait_replicas,
        })
    }
}

/// The coordinators for `replicas` replicas in this process: the one memory
/// coordinator for all, or one Redis connection (pool) per replica.
///
/// # Errors
/// A message when Redis cannot be reached or refuses the settings.
pub fn coordinators(
    redis: Option<&RedisSettings>,
    replicas: usize,
) -> Result<Vec<Arc<dyn Coordinator>>, String> {
    match redis {
        None => {
            let shared: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new());
            Ok(vec![shared; replicas])
        }
        Some(settings) => (0..replicas).map(|_| connect(settings)).collect(),
    }
}

/// One connection (pool) to the run's Redis server.
///
/// # Errors
/// A message when the server cannot be reached, refuses the credentials, or the
/// options are refused.
#[cfg(feature = "redis")]
pub fn connect(settings: &RedisSettings) -> Result<Arc<dyn Coordinator>, String> {
    use botmesh::redis::{RedisCoordinator, RedisOptions};
    let base = if !settings.cluster.is_empty() {
        RedisOptions::cluster(settings.cluster.iter().cloned())
    } else if let Some(service) = &settings.service {
        RedisOptions::sentinel(settings.sentinel.iter().cloned(), service.clone())
    } else {
        RedisOptions::new(settings.url.as_str())
    };
    let options = base
        .with_key_prefix(settings.key_prefix.as_str())
        .with_lease_ttl(settings.lease_ttl)
        .with_dedup_ids(settings.dedup_ids)
        .with_wait_replicas(settings.wait_replicas);
    // A replica may start while the server restarts or loads its data (a fault run):
    // keep trying for a while, as a supervisor restarting the process would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        match RedisCoordinator::connect(options.clone()) {
            Ok(coordinator) => return Ok(Arc::new(coordinator)),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!("--backend redis: cannot use Redis: {e}"));
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// Without the `redis` feature there is no Redis backend to connect to.
///
/// # Errors
/// Always.
#[cfg(not(feature = "redis"))]
pub fn connect(_settings: &RedisSettings) -> Result<Arc<dyn Coordinator>, String> {
    Err("--backend redis: botmesh was built without its `redis` feature".to_owned())
}
