//! A QMP client (QEMU's JSON machine protocol, `docs/interop/qmp-spec.rst`
//! in QEMU's tree) on a unix socket, as libvirt drives QEMU for a live
//! migration: greeting, `qmp_capabilities`, then one command at a time,
//! skipping the asynchronous events QEMU interleaves.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// One QMP connection in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// How long one command may take to answer.
const ANSWER: Duration = Duration::from_secs(30);

impl Qmp {
    /// Connects to `socket` (waiting up to `wait` for QEMU to create it),
    /// reads the greeting and leaves capabilities negotiation.
    pub fn connect(socket: &Path, wait: Duration) -> Result<Self> {
        let deadline = Instant::now() + wait;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("connecting to QMP at {} within {wait:?}", socket.display())
                    });
                }
            }
        };
        stream.set_read_timeout(Some(ANSWER))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            bail!(
                "QEMU did not greet with QMP on {}: {greeting}",
                socket.display()
            );
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .context("reading from QMP")?;
        if n == 0 {
            bail!("QEMU closed its QMP socket");
        }
        serde_json::from_str(&line).with_context(|| format!("QMP sent something not JSON: {line}"))
    }

    /// Runs `command` with `arguments` and returns its `return` value; a QMP
    /// `error` becomes an error carrying QEMU's description.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        self.writer
            .write_all(format!("{msg}\n").as_bytes())
            .with_context(|| format!("sending {command} to QMP (did QEMU exit?)"))?;
        loop {
            let v = self.read()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                bail!(
                    "QMP {command} failed: {}",
                    e["desc"].as_str().unwrap_or("no description")
                );
            }
            // An event ({"event": ...}): not the answer.
        }
    }

    /// The VM's run state (`query-status`), e.g. `running`, `inmigrate`,
    /// `postmigrate`.
    pub fn status(&mut self) -> Result<String> {
        let v = self.execute("query-status", None)?;
        v["status"]
            .as_str()
            .map(str::to_string)
            .context("query-status without a status")
    }
}
