//! Registering a resource with the kubelet.

use crate::config::ResourceConfig;
use crate::error::{Error, Result};
use crate::kubelet::server::plugin_options;
use kubelet_proto::transport::connect_unix;
use kubelet_proto::v1beta1::registration_client::RegistrationClient;
use kubelet_proto::v1beta1::{RegisterRequest, VERSION};
use std::path::Path;
use std::time::Duration;

/// The request that registers `cfg`: API version `v1beta1`, the socket's file
/// name as endpoint, the full resource name, and our options.
pub(crate) fn registration_request(cfg: &ResourceConfig) -> RegisterRequest {
    RegisterRequest {
        version: VERSION.to_string(),
        endpoint: cfg.socket_name(),
        resource_name: cfg.resource_name(),
        options: Some(plugin_options()),
    }
}

/// Calls `Register` on the kubelet's socket for `cfg`. The plugin's own
/// socket must already be serving: the kubelet dials it back at once.
pub async fn register(
    kubelet_socket: &Path,
    cfg: &ResourceConfig,
    timeout: Duration,
) -> Result<()> {
    let channel = connect_unix(kubelet_socket, timeout).await?;
    let mut client = RegistrationClient::new(channel);
    let op = || format!("registering {} with the kubelet", cfg.resource_name());
    match tokio::time::timeout(timeout, client.register(registration_request(cfg))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(Error::Grpc {
            op: op(),
            status: Box::new(status),
        }),
        Err(_) => Err(Error::Grpc {
            op: op(),
            status: Box::new(tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_proto::v1beta1::KUBELET_SOCKET;

    const WAIT: Duration = Duration::from_secs(5);

    /// The message of a registration on `sock` that cannot connect.
    async fn connect_error(sock: &Path) -> String {
        let e = register(sock, &ResourceConfig::for_nic("eth0"), WAIT).await;
        e.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn a_missing_or_stale_kubelet_socket_is_named_with_the_likely_cause() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join(KUBELET_SOCKET);
        let at = format!("connecting to {}: ", sock.display());
        assert_eq!(
            connect_error(&sock).await,
            format!(
                "{at}the socket does not exist (its server is not running, or the directory is \
                 not the one the server uses)"
            )
        );
        // A socket file whose listener is gone: what a stopped kubelet leaves.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert_eq!(
            connect_error(&sock).await,
            format!(
                "{at}nothing listens on the socket (a stale socket file of a server that stopped)"
            )
        );
    }

    #[test]
    fn request_has_the_kubelet_fields() {
        let r = registration_request(&ResourceConfig::for_nic("eth0"));
        assert_eq!(r.version, "v1beta1");
        assert_eq!(r.endpoint, "macvtap.network.kubevirt.io_eth0");
        assert_eq!(r.resource_name, "macvtap.network.kubevirt.io/eth0");
        let o = r.options.unwrap();
        assert!(!o.pre_start_required && !o.get_preferred_allocation_available);
    }
}
