//! From options to a [`Target`]: the URLs with the password applied, the TLS files
//! read, and the way servers are found again (one server, cluster seeds, sentinels).

use super::options::{Mode, RedisOptions, mode};
use super::target::{Loader, Source, Target};
use super::url::connection_info;
use super::url::host_port;
use crate::coordinator::BackendError;

/// Reads one TLS file; the error names the field and the path.
#[cfg(feature = "tls")]
fn read_file(field: &str, path: &std::path::Path) -> Result<Vec<u8>, BackendError> {
    std::fs::read(path)
        .map_err(|e| BackendError::new(format!("{field}: cannot read {:?}: {e}", path.display())))
}

/// The certificates of `o.tls`, read now so a missing file is reported at connect.
#[cfg(feature = "tls")]
fn certs(o: &RedisOptions) -> Result<Option<redis::TlsCertificates>, BackendError> {
    if !o.tls.is_set() {
        return Ok(None);
    }
    let root_cert = match &o.tls.ca_file {
        Some(p) => Some(read_file("tls.caFile", p)?),
        None => None,
    };
    let client_tls = match (&o.tls.client_cert, &o.tls.client_key) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read_file("tls.clientCert", c)?,
            client_key: read_file("tls.clientKey", k)?,
        }),
        _ => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The target the options describe, with its servers read (the slot map in cluster
/// mode, the primary under Sentinel).
///
/// # Errors
/// A message naming the field for bad options (see [`mode`]) or an unreadable TLS
/// file; a failure to reach the servers.
pub(super) fn target(
    o: &RedisOptions,
    loader: Loader,
    missing: fn(&redis::RedisError) -> bool,
) -> Result<Target, BackendError> {
    let mode = mode(o).map_err(BackendError::new)?;
    #[cfg(feature = "tls")]
    let certs = certs(o)?;
    let pw = o.password.as_deref();
    let (source, base, label) = match mode {
        Mode::Single(url) => {
            let info = connection_info("url", url, pw).map_err(BackendError::new)?;
            let label = info.addr().to_string();
            (Source::Single, info, label)
        }
        Mode::Cluster(urls) => {
            let mut infos = Vec::with_capacity(urls.len());
            for (i, url) in urls.iter().enumerate() {
                infos.push(
                    connection_info(&format!("cluster[{i}]"), url, pw)
                        .map_err(BackendError::new)?,
                );
            }
            let seeds: Vec<(String, u16)> = infos.iter().map(|i| host_port(i.addr())).collect();
            let label = format!(
                "cluster {}",
                seeds
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let base = infos.swap_remove(0);
            (Source::Cluster(seeds), base, label)
        }
        Mode::Sentinel(s) => {
            let lookup = super::sentinel::Lookup::new(s)?;
            let label = lookup.label();
            let base = lookup.base(pw);
            (Source::Sentinel(lookup), base, label)
        }
    };
    Target::new(
        source,
        base,
        #[cfg(feature = "tls")]
        certs,
        o.command_timeout,
        loader,
        missing,
        label,
    )
}
