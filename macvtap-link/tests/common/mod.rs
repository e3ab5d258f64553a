//! Fixtures of the kernel tests: a named network namespace deleted on drop,
//! `ip` that panics on failure, and the loud root check.
#![allow(dead_code, clippy::unwrap_used)]

use std::process::Command;

/// A network namespace named `<tag>-<pid>`, deleted on drop.
pub struct Ns(pub String);

impl Ns {
    /// Creates it; fails the test loudly without root.
    pub fn new(tag: &str) -> Self {
        if !nix::unistd::geteuid().is_root() {
            panic!("NOT RUN: this test needs root (it creates a network namespace)");
        }
        let ns = Ns(format!("{tag}-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        ns
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `ip ARGS` and panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
