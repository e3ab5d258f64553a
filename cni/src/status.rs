//! STATUS and GC (cniVersion 1.1.0): both are delegated to IPAM when there
//! is one. The macvtap links themselves need no collecting: a pod's link dies
//! with its namespace, and links never moved are the device plugin's to reclaim.

use crate::config::NetConf;
use crate::env::{CniEnv, Command};
use crate::error::{Error, Result};
use crate::ipam;
use crate::stdin::Stdin;
use crate::version::Version;

/// Runs STATUS: ready unless the node settings file is unusable
/// (`settings_problem`, which every ADD would fail on: the spec's code 50)
/// or the IPAM plugin says otherwise.
pub(crate) fn status(
    env: &CniEnv,
    conf: &NetConf,
    settings_problem: Option<&str>,
    stdin: &[u8],
) -> Result<()> {
    conf.version.require(Version::V1_1_0, "STATUS")?;
    if let Some(problem) = settings_problem {
        return Err(Error::NotAvailable(problem.to_string()));
    }
    if let Some(plugin) = conf.ipam_type()? {
        ipam::exec(env, &plugin, Command::Status, stdin)?;
    }
    Ok(())
}

/// Runs GC, handing IPAM the valid attachments under the spec's current key
/// `cni.dev/valid-attachments` even when they came as `cni.dev/attachments`
/// (in the configuration `conf` was read from, `stdin`).
pub(crate) fn gc(env: &CniEnv, conf: &NetConf, stdin: &Stdin) -> Result<()> {
    conf.version.require(Version::V1_1_0, "GC")?;
    let Some(plugin) = conf.ipam_type()? else {
        return Ok(());
    };
    // `conf` was read from it, so stdin is JSON.
    let mut raw = stdin
        .json()
        .cloned()
        .ok_or_else(|| Error::Decode("stdin is not JSON".into()))?;
    if let Some(obj) = raw.as_object_mut() {
        if !obj.contains_key("cni.dev/valid-attachments") {
            // Without any list, IPAM would free every address: refuse instead.
            let list = obj.get("cni.dev/attachments").cloned().ok_or_else(|| {
                Error::InvalidConfig(
                    "GC needs cni.dev/valid-attachments (or cni.dev/attachments)".into(),
                )
            })?;
            obj.insert("cni.dev/valid-attachments".into(), list);
        }
    }
    let body = serde_json::to_vec(&raw).map_err(|e| Error::Decode(e.to_string()))?;
    ipam::exec(env, &plugin, Command::Gc, &body)?;
    Ok(())
}
