//! A device's macvtap: made or reused (`create`), a refusal of the
//! kernel's explained (`refusal`), its tap node checked (`devfs`, with
//! `mountinfo` for why a node never appears), and the devices of one
//! request made all or none (`prepare`).

mod create;
mod devfs;
mod mountinfo;
mod prepare;
#[cfg(test)]
mod prepare_tests;
mod refusal;

pub use create::{PreparedDevice, create_device};
pub(crate) use create::{Recreated, recreate_device};
pub(crate) use mountinfo::not_devtmpfs;
pub(crate) use prepare::hand_out;
// What another front (a DRA driver) calls to prepare devices; only
// `hand_out` and the tests beside `prepare` call them today.
#[allow(unused_imports)]
pub(crate) use prepare::{check_ids, prepare};
