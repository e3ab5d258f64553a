//! Cluster end-to-end: with `KUBECONFIG` pointing at a cluster that runs
//! Multus and KubeVirt (see `hack/kind-cluster.sh`), apply the manifests,
//! wait for the DaemonSet, check every node advertises macvtap resources,
//! start the example VM on a macvtap network and check its interface in the
//! VMI status, then clean up. It is `#[ignore]`d, so the suite shows it as
//! skipped; `hack/kind-cluster.sh` runs it (`--run-ignored only`), and run
//! without `KUBECONFIG` it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use macvtap_e2e::manifests::{parse_docs, render};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "macvtap-system";
const VM_NAMESPACE: &str = "default";
const PREFIX: &str = "macvtap.network.kubevirt.io/";

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(manifests().join("examples").join(name)).unwrap();
    parse_docs(&text).unwrap().remove(0)
}

async fn api_for(client: &Client, obj: &Value) -> Result<Api<DynamicObject>> {
    let api_version = obj["apiVersion"].as_str().context("apiVersion")?;
    let kind = obj["kind"].as_str().context("kind")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {kind}"))?;
    Ok(match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &ar),
        Scope::Namespaced => {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or(VM_NAMESPACE);
            Api::namespaced_with(client.clone(), ns, &ar)
        }
    })
}

async fn apply(client: &Client, obj: &Value) -> Result<()> {
    let api = api_for(client, obj).await?;
    let name = obj["metadata"]["name"].as_str().context("name")?;
    api.patch(
        name,
        &PatchParams::apply("macvtap-e2e").force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("applying {}/{name}", obj["kind"]))?;
    Ok(())
}

async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        match check().await {
            Ok(Some(v)) => {
                println!("ok: {what} after {:.0?}", start.elapsed());
                return Ok(v);
            }
            Ok(None) => {}
            Err(e) => println!("waiting for {what}: {e:#}"),
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

#[tokio::test]
#[ignore = "needs a cluster with Multus and KubeVirt: hack/kind-cluster.sh makes one and runs this"]
async fn manifests_and_a_vm_on_a_real_cluster() -> Result<()> {
    if std::env::var_os("KUBECONFIG").is_none() {
        bail!(
            "the cluster e2e needs KUBECONFIG pointing at a cluster with Multus and KubeVirt \
             (hack/kind-cluster.sh makes one and runs this test); nothing was checked"
        );
    }
    let client = Client::try_default()
        .await
        .context("connecting with KUBECONFIG")?;
    let outcome = run(&client).await;
    let cleanup = clean_up(&client).await;
    outcome.and(cleanup)
}

async fn run(client: &Client) -> Result<()> {
    for obj in render(&manifests().join("base"))? {
        apply(client, &obj).await?;
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for(
        "the DaemonSet to be ready on every node",
        Duration::from_secs(300),
        async || {
            let ds = daemonsets.get("macvtap-cni").await?;
            let st = ds.status.context("no status")?;
            Ok(
                (st.desired_number_scheduled > 0 && st.number_ready == st.desired_number_scheduled)
                    .then_some(()),
            )
        },
    )
    .await?;

    let nodes: Api<Node> = Api::all(client.clone());
    let resource = wait_for(
        "macvtap resources on every node",
        Duration::from_secs(120),
        async || {
            let list = nodes.list(&Default::default()).await?;
            let mut first = None;
            for node in &list.items {
                let alloc = node
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.clone())
                    .unwrap_or_default();
                let found: Vec<_> = alloc
                    .keys()
                    .filter(|k| k.starts_with(PREFIX))
                    .cloned()
                    .collect();
                if found.is_empty() {
                    return Ok(None);
                }
                first.get_or_insert(found[0].clone());
            }
            Ok(first)
        },
    )
    .await?;
    println!("using resource {resource}");

    let mut nad = example("nad.yaml");
    nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] = json!(resource);
    apply(client, &nad).await?;
    let kv = example("kubevirt-cr-patch.yaml");
    let kv_api = api_for(client, &kv).await?;
    kv_api
        .patch(
            "kubevirt",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": kv["spec"]})),
        )
        .await
        .context("registering the macvtap binding in the KubeVirt CR")?;
    let vm = example("vm.yaml");
    apply(client, &vm).await?;
    let mac = vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][1]["macAddress"]
        .as_str()
        .unwrap()
        .to_string();
    let vmi_probe = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                           "metadata": {"name": "vm-macvtap", "namespace": VM_NAMESPACE}});
    let vmis = api_for(client, &vmi_probe).await?;
    wait_for(
        "the VMI's macvtap interface with its MAC",
        Duration::from_secs(600),
        async || {
            let vmi = vmis.get("vm-macvtap").await?;
            let ifaces = vmi.data["status"]["interfaces"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            Ok(ifaces
                .iter()
                .any(|i| {
                    i["name"] == "dataplane"
                        && i["mac"]
                            .as_str()
                            .is_some_and(|m| m.eq_ignore_ascii_case(&mac))
                })
                .then_some(()))
        },
    )
    .await
}

async fn clean_up(client: &Client) -> Result<()> {
    let dp = DeleteParams::default();
    for obj in [example("vm.yaml"), example("nad.yaml")] {
        let api = api_for(client, &obj).await?;
        let _ = api
            .delete(obj["metadata"]["name"].as_str().unwrap(), &dp)
            .await;
    }
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let _ = api_for(client, &ns).await?.delete(NAMESPACE, &dp).await;
    Ok(())
}
