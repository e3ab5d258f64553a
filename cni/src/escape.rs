//! No input reaches a log line or an error message with a raw control
//! character.
//!
//! Device IDs, network names, `CNI_ARGS`, paths and IPAM output come from
//! NetworkAttachmentDefinitions and pod annotations, that is from namespace
//! users. A newline in one of them would start a line of its own in a log
//! file (an `authorized_keys` line, a forged log entry), an escape sequence
//! would drive the terminal of whoever reads the log. So every log line is
//! escaped as it is written ([`EscapingWriter`]), and every error message as
//! it leaves (`escape_controls` in `error_json`): whatever a message
//! quotes, it stays on one line.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

/// Whether `c` must not be written raw: C0 and C1 controls (newline,
/// carriage return, ESC, NEL, ...), Unicode line and paragraph separators,
/// and the bidirectional overrides that make text display other than it reads.
pub(crate) fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every unsafe character written as Rust writes it in a string
/// literal (`\n`, `\r`, `\t`, `\u{1b}`); a backslash itself is left as it
/// is, since it cannot start a line. Borrows when there is nothing to escape.
pub(crate) fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) {
            // escape_default gives \n, \r, \t and \u{..} for the rest.
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A writer for formatted log events: each write is one event, and every
/// unsafe character in it is escaped except the newline that ends it.
///
/// `tracing-subscriber`'s formatter renders an event into a buffer and hands
/// it over in one `write_all`; this writer always takes a whole buffer, so an
/// event is never split.
#[derive(Debug)]
pub struct EscapingWriter<W> {
    inner: W,
}

impl<W: Write> EscapingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self { inner }
    }
}

impl<W: Write> Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (text.as_ref(), ""),
        };
        let line = format!("{}{end}", escape_controls(body));
        self.inner.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        assert!(matches!(
            escape_controls("dataplaneMvp3 /run/netns/é"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn every_control_character_is_escaped() {
        let hostile = "x\nssh-ed25519 AAAA attacker\r\x1b[2J\t\u{85}\u{2028}\u{202e}\0";
        let out = escape_controls(hostile);
        assert!(!out.chars().any(is_unsafe), "{out}");
        assert_eq!(
            out,
            "x\\nssh-ed25519 AAAA attacker\\r\\u{1b}[2J\\t\\u{85}\\u{2028}\\u{202e}\\u{0}"
        );
    }

    #[test]
    fn the_writer_keeps_one_event_on_one_line() {
        let mut out = Vec::new();
        let mut w = EscapingWriter::new(&mut out);
        w.write_all(b"ERROR device x\nssh-ed25519 AAAA: missing\n")
            .unwrap();
        w.write_all(b"INFO second\r\n").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "ERROR device x\\nssh-ed25519 AAAA: missing\nINFO second\\r\n"
        );
        assert_eq!(text.lines().count(), 2);
        assert!(!text.lines().any(|l| l.starts_with("ssh-ed25519")));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_passed_on() {
        let mut out = Vec::new();
        EscapingWriter::new(&mut out)
            .write_all(b"a\xff\x1bb\n")
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "a\u{fffd}\\u{1b}b\n");
    }
}
