//! The DRA front: the same macvtaps as the device plugin front, served to
//! the kubelet through Dynamic Resource Allocation (`resource.k8s.io/v1`).
//!
//! - [`cdi`]: the CDI spec per prepared claim that gives its containers
//!   their `/dev/tapN`, and the front's record of what it prepared.
//! - [`claims`]: which of this node's devices a ResourceClaim was allocated.
//! - [`health`]: the devices' health streamed to the kubelet
//!   (`v1.DRAResourceHealth`, KEP-4680).
//! - [`prepare`]: NodePrepareResources and NodeUnprepareResources of one
//!   claim, as plain functions on the core.
//! - [`publish`]: keeps the published ResourceSlices saying what the node
//!   offers.
//! - [`server`]: the registration, `v1.DRAPlugin` and health gRPC servers,
//!   which only translate.
//! - [`slices`]: the node's ResourceSlices as plain values and what must be
//!   written for the published ones to match.

pub mod cdi;
pub mod claims;
pub mod health;
pub mod prepare;
pub mod publish;
pub mod server;
pub mod slices;
