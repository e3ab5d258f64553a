//! The test kubelet's PodResources server
//! (`test_kubelet::TestPodResources`, which answers
//! `List` as the kubelet does), served from a runtime thread on
//! `<temp dir>/pod-resources/kubelet.sock` so the synchronous CNI tests can
//! use it, plus the node settings file that points the plugin at it.

use std::path::{Path, PathBuf};
use test_kubelet::{Code, PreparedClaim, PreparedDevice, TestPodResources, TokenBucket};

/// A running test PodResources server in its own kubelet dir.
pub struct PodResourcesKubelet {
    pub dir: tempfile::TempDir,
    server: Option<TestPodResources>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl PodResourcesKubelet {
    /// Serves on `<new temp dir>/pod-resources/kubelet.sock`.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("pod-resources/kubelet.sock");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(TestPodResources::start(&socket)).unwrap();
        Self {
            dir,
            server: Some(server),
            runtime: Some(runtime),
        }
    }

    /// The kubelet dir (what the node settings' `kubeletDir` names).
    pub fn kubelet_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Adds a pod holding `devices` (resource, device IDs).
    pub fn add_pod(&self, namespace: &str, name: &str, devices: &[(&str, &[&str])]) {
        self.server
            .as_ref()
            .unwrap()
            .add_pod(namespace, name, devices);
    }

    /// Adds a pod holding `device_ids` through one ResourceClaim our DRA
    /// driver prepared (`<claim UID>_<device ID>` CDI IDs, DRA device names
    /// `<name>-mvp-<i>`), listed as the 1.37 kubelet lists it.
    pub fn add_dra_pod(&self, namespace: &str, name: &str, device_ids: &[&str]) {
        self.server.as_ref().unwrap().add_pod_with_claims(
            namespace,
            name,
            &[],
            &[dra_claim(namespace, name, device_ids)],
        );
    }

    /// Replaces the kubelet's rate limit (on by default) with `bucket`.
    pub fn set_rate_limit(&self, bucket: TokenBucket) {
        self.server.as_ref().unwrap().set_rate_limit(Some(bucket));
    }

    /// Makes every call fail with `code`.
    pub fn fail(&self, code: Code) {
        self.server.as_ref().unwrap().fail(Some(code));
    }

    /// Makes every call wait without an answer.
    pub fn hang(&self) {
        self.server.as_ref().unwrap().hang(true);
    }

    /// How many calls the hang has held so far.
    pub fn held(&self) -> usize {
        self.server.as_ref().unwrap().held()
    }

    /// Writes a node settings file naming this kubelet dir with `check`
    /// (`warn` or `enforce`); returns its path for `MACVTAP_CNI_SETTINGS`.
    pub fn settings(&self, check: &str) -> PathBuf {
        settings_file(self.dir.path(), self.kubelet_dir(), check)
    }
}

impl Drop for PodResourcesKubelet {
    fn drop(&mut self) {
        // The server stops with its runtime.
        self.server.take();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Writes `<dir>/macvtap.settings.json` with `kubelet_dir` and `check`.
pub fn settings_file(dir: &Path, kubelet_dir: &Path, check: &str) -> PathBuf {
    let path = dir.join("macvtap.settings.json");
    std::fs::write(
        &path,
        serde_json::json!({"kubeletDir": kubelet_dir, "podResourcesCheck": check}).to_string(),
    )
    .unwrap();
    path
}

/// The extended-resource claim of pod `namespace/name` our DRA driver
/// prepared with `device_ids` (the scheduler names it
/// `<pod>-extended-resources-<suffix>`).
pub fn dra_claim(namespace: &str, name: &str, device_ids: &[&str]) -> PreparedClaim {
    use macvtap_link::dra::{DRIVER, cdi_device_id, dra_device_name};
    let uid = format!("6f1c2d3e-{:04x}-4abc-8def-0123456789ab", name.len());
    PreparedClaim {
        name: format!("{name}-extended-resources-q4w8z"),
        namespace: namespace.into(),
        devices: device_ids
            .iter()
            .map(|id| {
                let (resource, index) = macvtap_link::parse_device_id(id).unwrap();
                PreparedDevice {
                    driver: DRIVER.into(),
                    pool: "node-1".into(),
                    device: dra_device_name(resource, index),
                    cdi_ids: vec![cdi_device_id(&uid, id)],
                }
            })
            .collect(),
    }
}
