//! A node's container runtime for the runtime test: the DaemonSet's pod spec
//! translated into OCI runtime configs the way the kubelet and containerd's
//! CRI plugin translate them, and run by Debian's `runc`.
//!
//! One file per job, each citing the upstream code it reproduces:
//! [`caps`] (the capability set of a `securityContext`), [`quantity`] (CPU
//! and memory quantities), [`config_map`] (a `configMap` volume), [`image`] (the podman image), [`spec`] (a
//! container's OCI config) with [`mounts`] (its mounts), and [`runc`] (the
//! container's lifecycle).
//!
//! Left out, on purpose: `oom_score_adj` (the kubelet gives
//! `system-node-critical` pods -997, but lowering it needs
//! `CAP_SYS_RESOURCE`, which this sandbox's bounding set lacks); seccomp
//! (the DaemonSet asks for `RuntimeDefault`, containerd's default filter,
//! which is not reproduced here: the containers run unfiltered) and AppArmor
//! (not enabled here); a cgroup namespace (containerd
//! adds one only on a unified cgroup v2 host, and this one is hybrid v1);
//! the pause container (each container gets its own IPC namespace, which no
//! one can tell from the pod's, as the init container and the daemon never
//! run at once); Service environment variables (there is no API server).

pub mod caps;
pub mod config_map;
pub mod image;
pub mod mounts;
pub mod quantity;
pub mod runc;
pub mod spec;

pub use caps::{ALL_CAPS, DEFAULT_CAPS, cap_mask, cap_names, capabilities, process_caps};
pub use image::{Image, ImageConfig};
pub use quantity::{memory_bytes, milli_cpu};
pub use runc::{RuncContainer, unique_id};
pub use spec::{DEFAULT_TERMINATION_MESSAGE_PATH, MASKED_PATHS, PodSandbox, READONLY_PATHS};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;

/// Numbers container IDs and termination message files of this process.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The strings of a JSON array (none when it is not one).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
