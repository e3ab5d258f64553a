//! The core of the node agent: the node's truth, whatever front serves it.
//!
//! It knows the node's NICs and their health ([`nic`]) from one table of
//! the node's links kept by netlink events (`link_table`) and what the
//! node uses of them itself, its addresses and default routes kept the
//! same way (`addressing`), decides which
//! resources the node should serve and what a change changes of them
//! (`wanted`), holds the
//! host's namespace on the kernel seam with the host's paths ([`host`]), makes, reuses and checks devices' macvtaps ([`link`]), keeps
//! what was handed out ([`ledger`]), brings a held device's lost link
//! back ([`heal`]) and removes leaked ones ([`reclaim`]), and says what
//! is left undone without a mount of the host's (`degraded`), and
//! removes what is ours from the node at an uninstall (`cleanup`), once the
//! work under way that changes the node has finished ([`inflight`]).
//! What it does and finds it reports through one trait a front implements
//! (`report`), so it imports no front.
//! The fronts only translate: the kubelet's device plugin API
//! ([`crate::kubelet`]) and the operator's metrics, Events, `doctor` and
//! HTTP. A second front (a DRA driver) calls the same functions.

pub(crate) mod addressing;
pub(crate) mod cleanup;
pub(crate) mod degraded;
pub mod heal;
pub mod host;
pub mod inflight;
pub mod ledger;
pub mod link;
pub(crate) mod link_table;
pub mod nic;
pub mod reclaim;
pub(crate) mod report;
pub(crate) mod wanted;
