//! The config file, live: its directory is watched before the file is first
//! read ([`watch_then_read`]), so an edit saved during start-up is an
//! event; each change is resolved again ([`change`]) and applied, or
//! refused with the running configuration kept.

use super::Daemon;
use crate::config::{self, Resolved, Source};
use crate::error::{Error, Result};
use crate::events::NodeEvent;
use crate::fswatch::DirWatcher;
use crate::options::Options;
use nix::sys::inotify::WatchDescriptor;
use tracing::{debug, error, info};

/// The configuration as first read, and the watch of the config file's
/// directory that was in place before.
#[derive(Debug)]
pub(super) struct Loaded {
    /// The watch of the config file's directory, if there is a config file.
    pub(super) config_wd: Option<WatchDescriptor>,
    /// The resolved configuration.
    pub(super) resolved: Resolved,
    /// The config file's text, if there is a config file.
    pub(super) file_text: Option<String>,
}

/// Watches the config file's directory on `fs`, then reads the
/// configuration with `read`: in this order, so that an edit saved right
/// after the read is an event on `fs` and gets applied.
pub(super) fn watch_then_read(
    fs: &DirWatcher,
    opts: &Options,
    read: impl FnOnce(&Options) -> Result<(Resolved, Option<String>)>,
) -> Result<Loaded> {
    let config_wd = match opts.config_dir() {
        Some(d) => Some(fs.watch_dir(&d)?),
        None => None,
    };
    let (resolved, file_text) = read(opts)?;
    Ok(Loaded {
        config_wd,
        resolved,
        file_text,
    })
}

/// What a config file that now reads `text` asks of a daemon that last
/// read `last` from it.
#[derive(Debug)]
pub(super) enum Change {
    /// The same text: nothing to do.
    Unchanged,
    /// `--resource` flags take precedence over any file.
    FlagsWin,
    /// A valid configuration to apply.
    Apply(Resolved),
    /// Invalid: the running configuration stays.
    Invalid(Error),
}

/// Resolves the sources of `opts` again with the config file reading
/// `text`, unless that is the `last` text read.
pub(super) fn change(opts: &Options, last: Option<&str>, text: &str) -> Change {
    if last == Some(text) {
        return Change::Unchanged;
    }
    match config::resolve(&opts.sources(Some(text.to_string()))) {
        Ok(r) if r.source == Source::Flags => Change::FlagsWin,
        Ok(r) => Change::Apply(r),
        Err(e) => Change::Invalid(e),
    }
}

impl Daemon {
    /// Something changed in the config file's directory: reads the file and
    /// applies what changed.
    pub(super) fn reload_config(&mut self) {
        let Some(path) = self.opts.config_file.clone() else {
            return;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                debug!(file = %path.display(), error = %e, "config file not readable right now; keeping the current configuration");
                return;
            }
        };
        let change = change(&self.opts, self.file_text.as_deref(), &text);
        if !matches!(change, Change::Unchanged) {
            self.file_text = Some(text);
        }
        match change {
            Change::Unchanged => {}
            Change::FlagsWin => {
                info!(file = %path.display(), "config file changed, but --resource flags take precedence; nothing to apply");
            }
            Change::Apply(r) => {
                info!(file = %path.display(), resources = %r.resources, "config file changed; applying");
                self.apply_config(r);
                self.ctx.metrics.config_reload(true);
            }
            Change::Invalid(e) => {
                error!(error = %e, "config file changed but is invalid; keeping the current configuration");
                self.ctx.metrics.config_reload(false);
            }
        }
    }

    /// Serves what `resolved` asks for now, and logs and posts Events for
    /// the resources that came and went.
    fn apply_config(&mut self, resolved: Resolved) {
        let before: Vec<String> = self.plugins.keys().cloned().collect();
        self.resolved = resolved;
        self.reconcile();
        let after: Vec<String> = self.plugins.keys().cloned().collect();
        let added: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
        let removed: Vec<_> = before.iter().filter(|n| !after.contains(n)).collect();
        info!(
            added = %names(&added),
            removed = %names(&removed),
            "config change applied"
        );
        for (_, p) in self.plugins.iter().filter(|(n, _)| added.contains(n)) {
            let cfg = p.config();
            self.ctx.events.post(NodeEvent::ResourceAdded {
                resource: cfg.resource_name(),
                nic: cfg.lower_device.clone(),
                devices: cfg.capacity,
            });
        }
        for name in removed {
            self.ctx.events.post(NodeEvent::ResourceRemoved {
                resource: format!("{}/{name}", macvtap_link::RESOURCE_PREFIX),
            });
        }
    }
}

/// Resource names for a log line: `a, b`, or `none`.
fn names(list: &[&String]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
