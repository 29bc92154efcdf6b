//! Input files as streams of lines: plain or gzip (detected by its magic bytes, concatenated
//! members included, as logrotate writes them), `-` for standard input.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

const BUFFER: usize = 256 * 1024;

/// Opens `path` (`-`: stdin), decompressing gzip transparently.
pub fn open(path: &str) -> io::Result<Box<dyn BufRead>> {
    let raw: Box<dyn Read> =
        if path == "-" { Box::new(io::stdin().lock()) } else { Box::new(File::open(Path::new(path))?) };
    let mut peek = BufReader::with_capacity(BUFFER, raw);
    let gzip = peek.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip { Box::new(BufReader::with_capacity(BUFFER, MultiGzDecoder::new(peek))) } else { Box::new(peek) })
}

/// What [`next_line`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// A line is in the buffer, without its line ending.
    Read,
    /// A line longer than the limit: skipped to its end (its `bytes`, without the newline, counted;
    /// none kept).
    TooLong {
        bytes: u64,
    },
    End,
}

/// Reads the next line into `buf` without its line ending. A line over `max_len` bytes is not
/// kept: it is read through to its end and reported as [`Line::TooLong`], so memory stays within
/// `max_len` whatever the input (a gzip can expand to gigabytes without a newline).
pub fn next_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>, max_len: usize) -> io::Result<Line> {
    buf.clear();
    let mut total = 0u64;
    let mut too_long = false;
    let mut ended = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        let (chunk, found_end) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let used = chunk.len();
        total += used as u64;
        if !too_long {
            if buf.len() + used > max_len.saturating_add(2) {
                // Over the limit (with room for the line ending): stop keeping it.
                too_long = true;
                buf.clear();
                buf.shrink_to(max_len.min(64 * 1024));
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if found_end {
            ended = true;
            break;
        }
    }
    if total == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    if too_long || buf.len() > max_len {
        buf.clear();
        return Ok(Line::TooLong { bytes: total - u64::from(ended) });
    }
    Ok(Line::Read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines(path: &str) -> Vec<String> {
        let mut r = open(path).unwrap();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while next_line(r.as_mut(), &mut buf, 1024).unwrap() == Line::Read {
            out.push(String::from_utf8(buf.clone()).unwrap());
        }
        out
    }

    #[test]
    fn plain_and_gzip_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.log");
        std::fs::write(&plain, "one\r\ntwo\n\nthree").unwrap();
        let gz = dir.path().join("a.log.gz");
        // Two gzip members back to back, as `cat a.gz b.gz` or logrotate produce.
        let mut bytes = Vec::new();
        for part in ["one\r\ntwo\n", "\nthree"] {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(part.as_bytes()).unwrap();
            bytes.extend(enc.finish().unwrap());
        }
        std::fs::write(&gz, bytes).unwrap();
        let want = ["one", "two", "", "three"];
        assert_eq!(lines(plain.to_str().unwrap()), want);
        assert_eq!(lines(gz.to_str().unwrap()), want);
        assert!(open(dir.path().join("missing").to_str().unwrap()).is_err());
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_whole_and_the_next_one_read() {
        let text = format!("short\n{}\nexact\r\n{}\nlast", "x".repeat(100), "y".repeat(6));
        let mut r = io::BufReader::with_capacity(8, text.as_bytes());
        let mut buf = Vec::new();
        let mut seen = Vec::new();
        loop {
            match next_line(&mut r, &mut buf, 5).unwrap() {
                Line::End => break,
                Line::Read => seen.push(String::from_utf8(buf.clone()).unwrap()),
                Line::TooLong { bytes } => seen.push(format!("too long: {bytes}")),
            }
            assert!(buf.capacity() <= 64, "the buffer never held the long line");
        }
        assert_eq!(seen, ["short", "too long: 100", "exact", "too long: 6", "last"]);
    }
}
