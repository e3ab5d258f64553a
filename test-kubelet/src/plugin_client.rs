//! The test's own client of a plugin socket (not the kubelet's registered
//! one), for raw calls: options, ListAndWatch, Allocate.

use anyhow::{Result, anyhow};
use kubelet_proto::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse,
};
use std::time::Duration;
use tonic::Status;
use tonic::transport::Channel;

/// A client of one plugin socket, for raw calls.
#[derive(Debug, Clone)]
pub struct PluginClient {
    /// The raw gRPC client, for calls not wrapped here.
    pub client: DevicePluginClient<Channel>,
}

impl PluginClient {
    /// `GetDevicePluginOptions`.
    pub async fn options(&mut self) -> Result<DevicePluginOptions, Status> {
        Ok(self
            .client
            .get_device_plugin_options(Empty {})
            .await?
            .into_inner())
    }

    /// Opens `ListAndWatch`.
    pub async fn list_and_watch(&mut self) -> Result<DeviceWatch, Status> {
        let stream = self.client.list_and_watch(Empty {}).await?.into_inner();
        Ok(DeviceWatch {
            stream,
            latest: Vec::new(),
        })
    }

    /// `Allocate` for one container with these device IDs.
    pub async fn allocate(&mut self, ids: &[&str]) -> Result<AllocateResponse, Status> {
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        Ok(self.client.allocate(req).await?.into_inner())
    }
}

/// An open ListAndWatch stream.
#[derive(Debug)]
pub struct DeviceWatch {
    stream: tonic::Streaming<ListAndWatchResponse>,
    /// The last device list received.
    pub latest: Vec<Device>,
}

impl DeviceWatch {
    /// The next device list, within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Result<Vec<Device>> {
        match tokio::time::timeout(timeout, self.stream.message()).await {
            Ok(Ok(Some(m))) => {
                self.latest = m.devices.clone();
                Ok(m.devices)
            }
            Ok(Ok(None)) => Err(anyhow!("ListAndWatch stream ended")),
            Ok(Err(s)) => Err(anyhow!("ListAndWatch: {s}")),
            Err(_) => Err(anyhow!("no ListAndWatch message within {timeout:?}")),
        }
    }

    /// Reads messages until one satisfies `pred` (the latest one already
    /// received counts), failing after `timeout` overall.
    pub async fn wait_until(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[Device]) -> bool,
    ) -> Result<Vec<Device>> {
        if !self.latest.is_empty() && pred(&self.latest) {
            return Ok(self.latest.clone());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let devices = self
                .next(left)
                .await
                .map_err(|e| anyhow!("{e}; last devices: {:?}", summary(&self.latest)))?;
            if pred(&devices) {
                return Ok(devices);
            }
        }
    }
}

/// `ID=health` pairs, for messages.
pub fn summary(devices: &[Device]) -> Vec<String> {
    devices
        .iter()
        .map(|d| format!("{}={}", d.id, d.health))
        .collect()
}
