//! The kubelet's PodResources API, asked which devices pods hold.

use super::rules::Held;
use crate::error::{Error, Result};
use kubelet_proto::podresources::v1::ListPodResourcesRequest;
use kubelet_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_proto::transport::connect_unix;
use std::path::Path;
use std::time::Duration;

/// Asks the PodResources API what pods hold of ours.
pub(crate) async fn list_allocated(socket: &Path, timeout: Duration) -> Result<Held> {
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
    Ok(Held::from_response(resp.get_ref()))
}
