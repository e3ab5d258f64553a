//! What the code under a unit test logs, as text (compiled for unit tests
//! only).

use std::sync::{Arc, Mutex};

/// The log lines written while a [`capture`] guard is held on this thread.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's logs (debug and up) while the guard lives.
pub(crate) fn capture() -> (tracing::subscriber::DefaultGuard, Captured) {
    let buf = Captured::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || out.clone())
        .with_ansi(false)
        .finish();
    (tracing::subscriber::set_default(subscriber), buf)
}

/// What `f` logs, as text.
pub(crate) fn logged(f: impl FnOnce()) -> String {
    let (guard, buf) = capture();
    f();
    drop(guard);
    buf.text()
}
