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

/// Reads the next line into `buf` without its line ending; `false` at the end.
pub fn next_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    if reader.read_until(b'\n', buf)? == 0 {
        return Ok(false);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines(path: &str) -> Vec<String> {
        let mut r = open(path).unwrap();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while next_line(r.as_mut(), &mut buf).unwrap() {
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
}
