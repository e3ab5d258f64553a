//! The config file, live: its directory is watched before the file is first
//! read ([`watch_then_read`]), so an edit saved during start-up is an
//! event; each change is resolved again ([`change`]) and applied, or
//! refused with the running configuration kept.

use super::resources::{Resources, Served};
use crate::config::{self, Resolved, Source};
use crate::error::{Error, Result};
use crate::fswatch::DirWatcher;
use crate::operator::events::NodeEvent;
use crate::options::{Options, read_config_file};
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
/// `now` (`None`: there is no such file now), unless that is what was
/// `last` read.
pub(super) fn change(opts: &Options, last: Option<&str>, now: Option<&str>) -> Change {
    if last == now {
        return Change::Unchanged;
    }
    match config::resolve(&opts.sources(now.map(str::to_string))) {
        Ok(r) if r.source == Source::Flags => Change::FlagsWin,
        Ok(r) => Change::Apply(r),
        Err(e) => Change::Invalid(e),
    }
}

impl Resources {
    /// Something changed in the config file's directory: reads the file
    /// that `opts` name and applies what changed; the answer is which
    /// resources came and went.
    pub(super) fn reload_config(&mut self, opts: &Options) -> Vec<Served> {
        let Some(path) = opts.config_file.clone() else {
            return Vec::new();
        };
        // A file that is gone is no source: the configuration falls back to
        // DP_MACVTAP_CONF or auto-discovery, as at a start without it.
        let text = match read_config_file(&path) {
            Ok(t) => t,
            Err(e) => {
                debug!(error = %e, "config file not readable right now; keeping the current configuration");
                return Vec::new();
            }
        };
        let change = change(opts, self.file_text.as_deref(), text.as_deref());
        let gone = text.is_none();
        if !matches!(change, Change::Unchanged) {
            self.file_text = text;
        }
        match change {
            Change::Unchanged => Vec::new(),
            Change::FlagsWin => {
                info!(file = %path.display(), "config file changed, but --resource flags take precedence; nothing to apply");
                Vec::new()
            }
            Change::Apply(r) if gone => {
                info!(file = %path.display(), source = %r.source, resources = %r.resources, "config file removed; applying the next source");
                let served = self.apply_config(r);
                self.metrics.config_reload(true);
                served
            }
            Change::Apply(r) => {
                info!(file = %path.display(), resources = %r.resources, "config file changed; applying");
                let served = self.apply_config(r);
                self.metrics.config_reload(true);
                served
            }
            Change::Invalid(e) => {
                error!(error = %e, "config file changed but is invalid; keeping the current configuration");
                self.metrics.config_reload(false);
                Vec::new()
            }
        }
    }

    /// Serves what `resolved` asks for now, and logs and posts Events for
    /// the resources that came and went.
    fn apply_config(&mut self, resolved: Resolved) -> Vec<Served> {
        let before = self.names();
        self.resolved = resolved;
        let served = self.reconcile();
        let after = self.names();
        let added: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
        let removed: Vec<_> = before.iter().filter(|n| !after.contains(n)).collect();
        info!(
            added = %names(&added),
            removed = %names(&removed),
            "config change applied"
        );
        for cfg in added.iter().filter_map(|n| self.config_of(n)) {
            self.events.post(NodeEvent::ResourceAdded {
                resource: cfg.resource_name(),
                nic: cfg.lower_device.clone(),
                devices: cfg.capacity,
            });
        }
        for name in removed {
            self.events.post(NodeEvent::ResourceRemoved {
                resource: format!("{}/{name}", macvtap_link::RESOURCE_PREFIX),
            });
        }
        served
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Resources;
    use crate::fswatch::FsEvent;
    use crate::options::load_config;
    use std::path::Path;
    use std::time::Duration;

    const ONE: &str = r#"[{"name":"dp","lowerDevice":"eth1","capacity":2}]"#;
    const TWO: &str =
        r#"[{"name":"dp","lowerDevice":"eth1","capacity":2},{"name":"dp2","lowerDevice":"eth1"}]"#;

    /// Options with config file `file` and the given `--resource` flags.
    fn options(file: &Path, flags: &[&str]) -> Options {
        Options {
            resource_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Options::for_tests(Some(file.to_path_buf()))
        }
    }

    /// The names of the resources in `r`.
    fn names_of(r: &Resolved) -> Vec<String> {
        match &r.resources {
            Resources::Static(list) => list.iter().map(|c| c.name.clone()).collect(),
            Resources::AutoDiscover(_) => vec!["(auto-discovery)".into()],
        }
    }

    /// An edit saved right after the first read (by a reader that renames
    /// the edit over the file once it has read it) is an event of the
    /// config watch, and applying it adds the new resource. Were the file
    /// read before its directory is watched, the edit would be no event.
    #[tokio::test]
    async fn an_edit_right_after_the_first_read_is_an_event() {
        let tmp = tempfile::tempdir().unwrap();
        let conf_dir = tmp.path().join("conf");
        std::fs::create_dir(&conf_dir).unwrap();
        let file = conf_dir.join("conf.json");
        std::fs::write(&file, ONE).unwrap();
        let edit = tmp.path().join("conf.edit");
        std::fs::write(&edit, TWO).unwrap();
        let opts = options(&file, &[]);
        let (fs, mut events) = DirWatcher::new().unwrap();

        let loaded = watch_then_read(&fs, &opts, |o| {
            let read = load_config(o);
            std::fs::rename(&edit, &file).unwrap();
            read
        })
        .unwrap();
        assert_eq!(names_of(&loaded.resolved), ["dp"], "the first read");
        let config_wd = loaded.config_wd.unwrap();

        // inotify keeps an instance's events in order: once this marker's
        // event is in, so is every event of the edit.
        std::fs::write(conf_dir.join("marker"), "").unwrap();
        let mut seen: Vec<FsEvent> = Vec::new();
        while !seen
            .iter()
            .any(|e| e.name.as_deref() == Some("marker".as_ref()))
        {
            let batch = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("the marker's event arrives")
                .unwrap();
            seen.extend(batch);
        }
        assert!(
            seen.iter().any(|e| e.wd == config_wd
                && e.name.as_deref() == Some("conf.json".as_ref())
                && e.is_create()),
            "the edit saved right after the first read is no event: {seen:?}"
        );

        // The event's reload applies the edit.
        let text = std::fs::read_to_string(&file).unwrap();
        match change(&opts, loaded.file_text.as_deref(), Some(&text)) {
            Change::Apply(r) => assert_eq!(names_of(&r), ["dp", "dp2"]),
            other => panic!("the edit is not applied: {other:?}"),
        }
    }

    #[test]
    fn without_a_config_file_nothing_is_watched() {
        let (fs, _events) = DirWatcher::new().unwrap();
        let mut opts = options(Path::new("unused"), &["eth0"]);
        opts.config_file = None;
        let loaded = watch_then_read(&fs, &opts, load_config).unwrap();
        assert!(loaded.config_wd.is_none());
        assert_eq!(loaded.file_text, None);
        assert_eq!(names_of(&loaded.resolved), ["eth0"]);
    }

    #[test]
    fn a_config_dir_that_cannot_be_watched_stops_the_start() {
        let (fs, _events) = DirWatcher::new().unwrap();
        let opts = options(Path::new("/nonexistent/conf.json"), &[]);
        let mut read = false;
        let r = watch_then_read(&fs, &opts, |o| {
            read = true;
            load_config(o)
        });
        assert!(r.is_err());
        assert!(!read, "nothing is read before the watch is in place");
    }

    /// A config file that is not there yet (an optional ConfigMap volume
    /// before the ConfigMap exists) is no source: the start goes on with
    /// the environment's configuration, and the file's creation is an event
    /// whose reload applies it.
    #[tokio::test]
    async fn a_config_file_created_after_the_start_is_applied() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("DP_MACVTAP_CONF");
        let mut opts = options(&file, &[]);
        opts.env_config = Some(ONE.into());
        let (fs, mut events) = DirWatcher::new().unwrap();

        let loaded = watch_then_read(&fs, &opts, load_config).unwrap();
        assert_eq!(loaded.file_text, None);
        assert_eq!(loaded.resolved.source, Source::Env);
        assert_eq!(names_of(&loaded.resolved), ["dp"]);

        std::fs::write(&file, TWO).unwrap();
        let config_wd = loaded.config_wd.unwrap();
        let mut seen: Vec<FsEvent> = Vec::new();
        while !seen
            .iter()
            .any(|e| e.wd == config_wd && e.name.as_deref() == Some("DP_MACVTAP_CONF".as_ref()))
        {
            let batch = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("the file's creation is an event")
                .unwrap();
            seen.extend(batch);
        }
        let now = read_config_file(&file).unwrap();
        match change(&opts, loaded.file_text.as_deref(), now.as_deref()) {
            Change::Apply(r) => {
                assert_eq!(r.source, Source::File(file.clone()));
                assert_eq!(names_of(&r), ["dp", "dp2"]);
            }
            other => panic!("the new file is not applied: {other:?}"),
        }
    }

    /// A config file removed (its ConfigMap deleted) hands the decision to
    /// the next source: `DP_MACVTAP_CONF` if set, else auto-discovery.
    #[test]
    fn a_removed_config_file_falls_back_to_the_next_source() {
        let mut opts = options(Path::new("conf.json"), &[]);
        match change(&opts, Some(TWO), None) {
            Change::Apply(r) => {
                assert_eq!(r.source, Source::Default);
                assert_eq!(
                    r.resources,
                    Resources::AutoDiscover(crate::config::DiscoveryPolicy::Spare)
                );
            }
            other => panic!("{other:?}"),
        }
        opts.env_config = Some(ONE.into());
        match change(&opts, Some(TWO), None) {
            Change::Apply(r) => {
                assert_eq!(r.source, Source::Env);
                assert_eq!(names_of(&r), ["dp"]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Anything but a missing file (here: a directory where the file should
    /// be) is an error, never an empty configuration.
    #[test]
    fn an_unreadable_config_file_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("conf.json");
        std::fs::create_dir(&file).unwrap();
        let e = load_config(&options(&file, &[])).unwrap_err();
        assert!(e.to_string().contains("reading the config file"), "{e}");
    }

    #[test]
    fn the_same_text_again_is_no_change() {
        let opts = options(Path::new("conf.json"), &[]);
        assert!(matches!(
            change(&opts, Some(ONE), Some(ONE)),
            Change::Unchanged
        ));
        assert!(matches!(change(&opts, None, None), Change::Unchanged));
    }

    #[test]
    fn a_new_valid_text_is_applied() {
        let opts = options(Path::new("conf.json"), &[]);
        match change(&opts, Some(ONE), Some(TWO)) {
            Change::Apply(r) => assert_eq!(names_of(&r), ["dp", "dp2"]),
            other => panic!("{other:?}"),
        }
        match change(&opts, None, Some("[]")) {
            Change::Apply(r) => assert_eq!(
                r.resources,
                Resources::AutoDiscover(crate::config::DiscoveryPolicy::Spare)
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn resource_flags_win_over_any_new_text() {
        let opts = options(Path::new("conf.json"), &["eth0"]);
        assert!(matches!(
            change(&opts, Some(ONE), Some(TWO)),
            Change::FlagsWin
        ));
    }

    #[test]
    fn an_invalid_text_is_refused_naming_the_entry() {
        let opts = options(Path::new("conf.json"), &[]);
        match change(&opts, Some(ONE), Some(r#"[{"name":"dp","mode":"nope"}]"#)) {
            Change::Invalid(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("entry 0 (\"dp\")") && msg.contains("\"nope\""),
                    "{msg}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
