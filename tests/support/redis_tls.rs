//! A real `redis-server` speaking only TLS (`--port 0 --tls-port P`) on a free
//! loopback port, with a certificate authority, a server certificate (for
//! 127.0.0.1) and a client certificate made for it by the `openssl` command line;
//! it asks clients for their certificate (`tls-auth-clients yes`). Killed and its
//! files removed when dropped. Nothing here mocks Redis.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running TLS-only server.
pub struct TlsRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a certificate signed by it for `name` (`server` with the SAN
/// 127.0.0.1, `client` without), as `<name>.crt` and `<name>.key`.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=botmesh test CA",
    ]);
    openssl(dir, &ca);
    for (name, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        let (key, csr, crt, ext_file) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        std::fs::write(dir.join(&ext_file), format!("{ext}\n")).expect("ext file");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj"]);
        let subj = format!("/CN=botmesh test {name}");
        req.push(&subj);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext_file,
            ],
        );
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl TlsRedis {
    /// Makes the certificates and starts the server; panics when it cannot (tests
    /// only).
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "botmesh-tls-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        make_certs(&dir);
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    "0",
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join("server.crt"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.crt"))
                .args(["--tls-auth-clients", "yes"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server (apt-get install redis-server)");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return TlsRedis {
                        child: Some(child),
                        port,
                        dir,
                    };
                }
                // Nothing to wait on: a starting server signals nothing but its port.
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server with TLS did not come up (built without TLS?)");
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The CA certificate file.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The client certificate and key files.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("client.crt"), self.dir.join("client.key"))
    }

    /// Keys without an expiry, read with `redis-cli --tls` (which must answer
    /// `PING` first, so a broken TLS set-up of the reader cannot read as "none").
    pub fn keys_without_ttl(&self) -> usize {
        let (cert, key) = self.client();
        let cli = |args: &[&str]| -> String {
            let out = Command::new("redis-cli")
                .args(["--tls", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .arg("--cacert")
                .arg(self.ca())
                .arg("--cert")
                .arg(&cert)
                .arg("--key")
                .arg(&key)
                .args(args)
                .output()
                .expect("redis-cli");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(cli(&["PING"]).trim(), "PONG", "redis-cli over TLS");
        cli(&["--scan"])
            .lines()
            .filter(|k| !k.is_empty() && cli(&["PTTL", k]).trim() == "-1")
            .count()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
