//! Hooks that let a test act at one exact point of the daemon's start-up
//! (feature `testkubelet` only; a release build has none of this).
//!
//! A race between two start-up steps cannot be shown by timing from the
//! outside. A hook makes the window a fixed point: the daemon itself does
//! what the test asked, exactly there, and the test checks the outcome.

use std::path::Path;
use tracing::info;

/// The variable naming a file that the daemon renames over its config file
/// right after reading the config file for the first time.
pub const CONFIG_EDIT_ENV: &str = "MACVTAP_DP_TEST_CONFIG_EDIT";

/// Right after the first read of `config_file`: when [`CONFIG_EDIT_ENV`]
/// names a file, renames it over `config_file`, as an editor saving the
/// file at that moment would.
pub fn after_config_read(config_file: &Path) {
    let Some(edit) = std::env::var_os(CONFIG_EDIT_ENV) else {
        return;
    };
    match std::fs::rename(&edit, config_file) {
        Ok(()) => info!(
            file = %config_file.display(),
            "test hook: replaced the config file right after reading it"
        ),
        Err(e) => info!(
            file = %config_file.display(),
            error = %e,
            "test hook: could not replace the config file"
        ),
    }
}
