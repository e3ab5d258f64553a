//! The operator's front: what the daemon shows the people who run it.
//! Prometheus metrics ([`metrics`], with the Go client's `process_*` from
//! `procstat`), the liveness heartbeat ([`liveness`]) and the HTTP server
//! of both ([`http`]), Kubernetes Events on the Node ([`events`]) and the
//! `doctor` subcommand's checks of a node ([`doctor`]), the watch of
//! our DaemonSet that tells an uninstall from a restart ([`owner`]) and
//! the watch of our Node (`node`). The
//! core reports to it through `observer`.

pub mod doctor;
pub mod events;
pub mod http;
pub mod liveness;
pub mod metrics;
pub(crate) mod node;
pub(crate) mod observer;
pub mod owner;
pub(crate) mod procstat;
