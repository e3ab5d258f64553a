//! The daemon's exit after an uninstall: when the watch of our DaemonSet
//! says it was deleted, the node is cleaned ([`clean_node`]) once the
//! servers are stopped, and what was removed and kept is logged.

use crate::core::cleanup::{Held, clean_node};
use crate::core::host::Host;
use crate::core::reclaim::list_allocated;
use crate::operator::owner::Uninstall;
use crate::options::Options;
use std::time::Duration;
use tracing::{info, warn};

/// How long an exit waits for the watch to report the DaemonSet's
/// deletion: the SIGTERM of an uninstall can come a moment before it.
const WATCH_LAG: Duration = Duration::from_secs(2);
/// How long the kubelet gets to say which devices pods hold.
const ASK_KUBELET: Duration = Duration::from_secs(3);
/// The CNI binary's name in the CNI bin dir (install-cni's default).
const CNI_NAME: &str = "macvtap";

/// Cleans the node when `uninstall` says our DaemonSet was deleted;
/// otherwise (a rollout, a restart) leaves everything to the next pod.
pub(super) async fn clean_if_uninstalled(opts: &Options, uninstall: &Uninstall) {
    if opts.owner.is_none() || !uninstall.going_within(WATCH_LAG).await {
        return;
    }
    let held = match list_allocated(&opts.pod_resources_socket(), ASK_KUBELET).await {
        Ok(ids) => Held::Devices(ids.len()),
        Err(e) => Held::Unknown(e.to_string()),
    };
    let plugin_dir = opts.plugin_dir();
    let cni_dir = opts.uninstall_cni_dir.clone();
    let cleaned = tokio::task::spawn_blocking(move || {
        Host::current(super::KERNEL).map(|host| {
            clean_node(
                host.link_ops(),
                &plugin_dir,
                cni_dir.as_deref(),
                CNI_NAME,
                &held,
            )
        })
    })
    .await;
    match cleaned {
        Ok(Ok(c)) => {
            let removed: Vec<String> = c.removed.iter().map(|p| p.display().to_string()).collect();
            info!(
                links = %c.links.join(", "),
                removed = %removed.join(", "),
                "uninstall: removed what is ours from this node"
            );
            for (link, e) in &c.links_failed {
                warn!(link = %link, error = %e, "uninstall: a link of ours could not be deleted");
            }
            for k in &c.kept {
                warn!(kept = %k, "uninstall: left on this node");
            }
        }
        Ok(Err(e)) => {
            warn!(error = %e, "uninstall: the host's namespace could not be opened; nothing was cleaned")
        }
        Err(e) => warn!(error = %e, "uninstall: the cleanup task failed"),
    }
}
