//! The kubelet's PodResources API, asked which devices pods hold.

use super::rules::allocated_ids;
use crate::error::{Error, Result};
use kubelet_proto::podresources::v1::ListPodResourcesRequest;
use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_proto::transport::connect_unix;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

/// Asks the PodResources API which device IDs of ours are allocated.
pub(crate) async fn list_allocated(socket: &Path, timeout: Duration) -> Result<HashSet<String>> {
    let channel = connect_unix(socket, timeout).await?;
    let mut client = PodResourcesListerClient::new(channel);
    let resp = tokio::time::timeout(timeout, client.list(ListPodResourcesRequest {}))
        .await
        .map_err(|_| Error::Grpc {
            op: "listing pod resources".into(),
            status: Box::new(tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        })?
        .map_err(|status| Error::Grpc {
            op: "listing pod resources".into(),
            status: Box::new(status),
        })?;
    Ok(allocated_ids(resp.get_ref()))
}
