//! Servers the harness runs itself (`--start`, `--start-baseline`, `--start-floor`), and what it reads about a server process from
//! /proc: its CPU time (utime + stime, all threads) and resident memory.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sidecar_injector::server::tls::DevCertificates;

use crate::client::{self, Target};

/// A webhook process started by the harness, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Launched {
    child: Child,
    /// Its URL on 127.0.0.1.
    pub url: String,
    /// The development CA that signed its certificate, PEM.
    pub ca_pem: Vec<u8>,
    dir: tempfile::TempDir,
}

/// Which webhook to start.
pub enum Kind<'a> {
    /// `sidecar-injector serve`: this binary's own copy of it, or the binary at the path, with extra flags.
    Injector { binary: Option<&'a Path>, extra: &'a [String] },
    /// The baseline webhook of `src/baseline.rs`.
    Baseline,
    /// The stack floor of `src/stack_floor.rs`, answering these answers (one per body), with extra flags.
    Floor { answers: &'a [Bytes], extra: &'a [String] },
}

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Setting up (certificate, temporary files, ports) failed.
    #[error("cannot prepare the server: {0}")]
    Setup(String),
    /// The process did not start.
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// The process exited, or never answered.
    #[error("{what} did not come up: {reason}\n{log}")]
    NotReady { what: String, reason: String, log: String },
}

impl Launched {
    /// Starts `kind` on 127.0.0.1 with a fresh certificate, pinned to `cpus` (a `taskset` list) if given, and
    /// waits until it accepts TLS connections.
    pub async fn start(kind: Kind<'_>, cpus: Option<&str>) -> Result<Launched, LaunchError> {
        let setup = |e: &dyn std::fmt::Display| LaunchError::Setup(e.to_string());
        let dir = tempfile::Builder::new().prefix("loadtest-").tempdir().map_err(|e| setup(&e))?;
        let certs = DevCertificates::generate().map_err(|e| setup(&e))?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &certs.cert_pem).map_err(|e| setup(&e))?;
        std::fs::write(&key, &certs.key_pem).map_err(|e| setup(&e))?;
        let port = free_port().map_err(|e| setup(&e))?;
        let listen = format!("127.0.0.1:{port}");
        let own = std::env::current_exe().map_err(|e| setup(&e))?;

        let (what, mut argv): (&str, Vec<String>) = match &kind {
            Kind::Injector { binary, extra } => {
                let metrics = format!("127.0.0.1:{}", free_port().map_err(|e| setup(&e))?);
                let mut argv = match binary {
                    Some(binary) => vec![binary.display().to_string()],
                    None => vec![own.display().to_string(), "__injector".into()],
                };
                argv.extend(["serve", "--listen", &listen, "--metrics-listen", &metrics].map(String::from));
                argv.extend(["--tls-cert".into(), path(&cert), "--tls-key".into(), path(&key)]);
                argv.extend(["--shutdown-delay", "0s", "--log", "warn"].map(String::from));
                argv.extend(extra.iter().cloned());
                ("sidecar-injector", argv)
            }
            Kind::Baseline => {
                let mut argv = vec![own.display().to_string(), "__baseline".into(), "--listen".into(), listen];
                argv.extend(["--tls-cert".into(), path(&cert), "--tls-key".into(), path(&key)]);
                ("baseline", argv)
            }
            Kind::Floor { answers, extra } => {
                let file = dir.path().join("answers.jsonl");
                crate::stack_floor::write_answers(&file, answers).map_err(|e| setup(&e))?;
                let mut argv = vec![own.display().to_string(), "__floor-server".into(), "--listen".into(), listen];
                argv.extend(["--tls-cert".into(), path(&cert), "--tls-key".into(), path(&key)]);
                argv.extend(["--answers".into(), path(&file)]);
                argv.extend(extra.iter().cloned());
                ("stack floor", argv)
            }
        };
        if let Some(cpus) = cpus {
            argv.splice(0..0, ["taskset".to_owned(), "-c".to_owned(), cpus.to_owned()]);
        }
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).map_err(|e| setup(&e))?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| setup(&e))?)
            .stderr(log)
            .spawn()
            .map_err(|source| LaunchError::Spawn { program: argv[0].clone(), source })?;
        let mut launched =
            Launched { child, url: format!("https://127.0.0.1:{port}/mutate"), ca_pem: certs.ca_pem.into_bytes(), dir };
        launched.wait_ready(what).await?;
        Ok(launched)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_ready(&mut self, what: &str) -> Result<(), LaunchError> {
        let not_ready = |launched: &Launched, reason: String| LaunchError::NotReady {
            what: what.to_owned(),
            reason,
            log: std::fs::read_to_string(launched.dir.path().join("server.log")).unwrap_or_default(),
        };
        let tls = client::tls_config(&self.ca_pem, Path::new("<generated CA>"), false)
            .map_err(|e| not_ready(self, e.to_string()))?;
        let target = Target::new(what, &self.url, tls, false).await.map_err(|e| not_ready(self, e.to_string()))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(not_ready(self, format!("it exited ({status})")));
            }
            match target.connect().await {
                Ok(_) => return Ok(()),
                Err(e) if started.elapsed() > Duration::from_secs(20) => return Err(not_ready(self, e.to_string())),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A port free on 127.0.0.1 right now (the kernel's choice, released for the server to take).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// What /proc says about a server process.
pub struct Probe {
    process: procfs::process::Process,
}

impl Probe {
    /// A probe of process `pid`.
    pub fn new(pid: u32) -> Result<Probe, String> {
        let process = procfs::process::Process::new(pid as i32).map_err(|e| format!("process {pid}: {e}"))?;
        let probe = Probe { process };
        probe.cpu_time()?;
        Ok(probe)
    }

    /// CPU time the process has used so far (user + system, all threads).
    pub fn cpu_time(&self) -> Result<Duration, String> {
        let stat = self.process.stat().map_err(|e| e.to_string())?;
        let ticks = stat.utime + stat.stime;
        Ok(Duration::from_secs_f64(ticks as f64 / procfs::ticks_per_second() as f64))
    }

    /// Resident memory now, and its peak over the process's life, in bytes.
    pub fn memory(&self) -> Result<(u64, u64), String> {
        let status = self.process.status().map_err(|e| e.to_string())?;
        Ok((status.vmrss.unwrap_or(0) * 1024, status.vmhwm.unwrap_or(0) * 1024))
    }
}
