//! The NICs: which links can carry a macvtap (`discovery`), who owns a
//! NIC's receive path ([`master`]), another port in the way of a mode
//! ([`port`]), what the node uses of its links itself (`usage`), where a
//! configured resource goes and on which NIC (`select`), a
//! resource's health from its NIC (`health`) and its NUMA node
//! (`topology`). One home for health, master, port and
//! `can_be_in_the_way`, all plain functions of the links.

pub(crate) mod discovery;
pub(crate) mod health;
pub mod master;
pub mod port;
pub(crate) mod select;
pub(crate) mod topology;
pub(crate) mod usage;
