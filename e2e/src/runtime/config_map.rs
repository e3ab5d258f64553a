//! A `configMap` volume as the kubelet projects it: the volume plugin
//! (`pkg/volume/configmap/configmap.go`, `SetUpAt`) turns the ConfigMap's
//! `data` into a payload (an optional ConfigMap that does not exist is an
//! empty payload; a required one is an error and the container does not
//! start), and `pkg/volume/util/atomic_writer.go` (`Write`) writes it: the
//! files into a new hidden timestamped directory, a `..data_tmp` symlink to
//! it renamed over `..data`, a user-visible symlink `<key>` ->
//! `..data/<key>` for each new key, the old timestamped directory removed,
//! and the user-visible symlinks of keys no longer there removed. A reader
//! of `<key>` sees the old text or the new one, never a mix. The kubelet
//! runs this again at each pod sync after the ConfigMap changed; here the
//! test calls [`project`] when it changes the ConfigMap.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers the timestamped directories (the kubelet's are named after the
/// time with a random suffix; only their uniqueness matters to a reader).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The files' mode: the volume's `defaultMode`, 0644 unless set.
const DEFAULT_MODE: u32 = 0o644;

/// Projects the ConfigMap `cm` (`None`: it does not exist) into the volume
/// directory `dir` as the kubelet does for a volume `optional` or not;
/// `what` names the volume in errors.
pub fn project(
    dir: &Path,
    cm: Option<&Value>,
    optional: bool,
    mode: Option<u32>,
    what: &str,
) -> Result<()> {
    let payload: Vec<(String, String)> = match cm {
        Some(cm) => cm["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
        None if optional => Vec::new(),
        None => bail!(
            "{what}: configmap not found (and the volume is not optional): the container would not start"
        ),
    };
    for (k, _) in &payload {
        if k.starts_with("..") || k.contains('/') {
            bail!("{what}: key {k:?} is not a valid file name");
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("{what}: {}", dir.display()))?;
    let data_link = dir.join("..data");
    let old_ts = std::fs::read_link(&data_link).ok();

    let ts_name = format!("..generation_{}", GENERATION.fetch_add(1, Ordering::SeqCst));
    let ts_dir = dir.join(&ts_name);
    std::fs::create_dir(&ts_dir)?;
    for (k, v) in &payload {
        let f = ts_dir.join(k);
        std::fs::write(&f, v)?;
        std::fs::set_permissions(
            &f,
            std::fs::Permissions::from_mode(mode.unwrap_or(DEFAULT_MODE)),
        )?;
    }
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&ts_name, &tmp_link)?;
    std::fs::rename(&tmp_link, &data_link)?;
    for (k, _) in &payload {
        let visible = dir.join(k);
        if std::fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new("..data").join(k), &visible)?;
        }
    }
    if let Some(old) = old_ts {
        std::fs::remove_dir_all(dir.join(old))?;
    }
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("..") && !payload.iter().any(|(k, _)| *k == name) {
            std::fs::remove_file(dir.join(&*name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_update_swaps_the_data_and_drops_removed_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        project(&dir, None, true, None, "v").unwrap();
        assert!(
            std::fs::read_dir(&dir).unwrap().all(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".."))
        );
        let cm = json!({"data": {"A": "one", "B": "two"}});
        project(&dir, Some(&cm), true, None, "v").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("A")).unwrap(), "one");
        assert_eq!(
            std::fs::read_link(dir.join("A")).unwrap(),
            Path::new("..data/A")
        );
        let cm = json!({"data": {"A": "three"}});
        project(&dir, Some(&cm), true, None, "v").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("A")).unwrap(), "three");
        assert!(std::fs::symlink_metadata(dir.join("B")).is_err());
        let hidden: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..generation"))
            .collect();
        assert_eq!(hidden.len(), 1, "the old data is removed: {hidden:?}");
        assert!(project(&tmp.path().join("other"), None, false, None, "v").is_err());
    }
}
