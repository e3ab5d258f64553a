//! A minimal `newc` cpio writer, enough for an initramfs the kernel unpacks.

use std::io::{self, Write};

/// Writes a newc archive entry by entry; [`Cpio::finish`] writes the trailer.
pub struct Cpio<W: Write> {
    out: W,
    ino: u32,
    written: usize,
}

impl<W: Write> Cpio<W> {
    /// Starts an archive on `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            written: 0,
        }
    }

    /// Adds a directory.
    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040755, &[])
    }

    /// Adds a regular file with permission bits `perm` (e.g. `0o755`).
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100000 | perm, data)
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        let ino = self.ino;
        self.ino += 1;
        let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
        let header = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len();
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0u8; 3][..n])
    }

    /// Writes the trailer and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, &[])?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_terminated() {
        let mut c = Cpio::new(Vec::new());
        c.dir("bin").unwrap();
        c.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        let out = c.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("#!/bin/sh"));
    }
}
