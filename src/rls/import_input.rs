//! What `weir import-rls` takes in, bounded before anything is parsed: regular files only (a FIFO
//! would block, `/dev/zero` never ends), at most [`MAX_FILE_BYTES`] each and [`MAX_TOTAL_BYTES`]
//! in all, directories at most [`MAX_DIR_DEPTH`] deep; and a YAML text whose nesting could
//! exceed [`MAX_NESTING`] is refused in one pass over it, since the YAML parser's time grows with
//! the square of the nesting (100,000 levels took 17 s to refuse) and its own limit (128 levels)
//! only acts once the whole text has been parsed.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest file read (envoyproxy/ratelimit's configs are ConfigMaps, at most 1 MiB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most read from every path together.
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// Directories nested deeper than this are refused (a symlink loop would never end).
pub const MAX_DIR_DEPTH: usize = 16;
/// The deepest nesting [`nesting_bound`] lets through to the parser, which refuses more than
/// 128 levels itself (a descriptor level is two: its list and its map).
pub const MAX_NESTING: usize = 1024;

/// The configs at `paths`: each a file, or a directory's `*.yaml`/`*.yml` files and
/// subdirectories in name order, as (name for messages, text). Names starting with `.` are
/// skipped: a Kubernetes ConfigMap volume holds each file twice, once under `..data`.
pub fn read_configs(paths: &[PathBuf]) -> Result<Vec<(String, String)>, String> {
    let mut files = Vec::new();
    let mut budget = MAX_TOTAL_BYTES;
    for path in paths {
        read_within(path, &mut files, &mut budget, 0).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    }
    Ok(files)
}

fn read_within(path: &Path, files: &mut Vec<(String, String)>, budget: &mut u64, depth: usize) -> Result<(), String> {
    if depth > MAX_DIR_DEPTH {
        return Err(format!("directories nested over {MAX_DIR_DEPTH} deep (a symlink loop?)"));
    }
    // Follows symlinks, as reading does; asked before opening, since opening a FIFO blocks.
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .and_then(|d| d.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>())
            .map_err(|e| e.to_string())?;
        entries.sort();
        for entry in entries {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let yaml = entry.extension().is_some_and(|x| x == "yaml" || x == "yml");
            if !name.starts_with('.') && (entry.is_dir() || yaml) {
                read_within(&entry, files, budget, depth + 1).map_err(|e| format!("{}: {e}", entry.display()))?;
            }
        }
        return Ok(());
    }
    if !meta.is_file() {
        return Err("not a regular file (a device, FIFO or socket is never read)".into());
    }
    let cap = MAX_FILE_BYTES.min(*budget);
    let mut text = String::new();
    // Read one byte past the cap to tell a file of exactly the cap from a larger one (a file can
    // grow after the size above was read).
    std::fs::File::open(path).and_then(|f| f.take(cap + 1).read_to_string(&mut text)).map_err(|e| e.to_string())?;
    if text.len() as u64 > cap {
        return Err(match cap < MAX_FILE_BYTES {
            true => format!("the configs together are over {} MiB", MAX_TOTAL_BYTES >> 20),
            false => format!("over {} MiB", MAX_FILE_BYTES >> 20),
        });
    }
    *budget -= text.len() as u64;
    files.push((path.display().to_string(), text));
    Ok(())
}

/// An upper bound of the nesting depth of a YAML text, in one pass and without parsing it.
///
/// Block nesting needs a deeper column at each level, or an indicator (`- `, `? `, `: `) that
/// moves the content right on the same line; a list may sit at its key's column, so a line's
/// block depth is at most twice the column its content starts at, plus one. Flow nesting is the
/// brackets (`[`, `{`) open at that point, outside quoted scalars and comments. Quotes are
/// followed within a line only (a quoted scalar's next line is counted as if unquoted), so a
/// quote misread can hide no more than the rest of its line, and every other misreading counts
/// more, never less: continuation lines, block scalars and brackets inside plain scalars.
pub fn nesting_bound(text: &str) -> usize {
    let mut flow = 0usize;
    let mut deepest = 0usize;
    for line in text.split('\n') {
        let bytes = line.as_bytes();
        let mut i = 0;
        // Indentation and the block indicators that start the line's content.
        loop {
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
            let indicator = i < bytes.len() && matches!(bytes[i], b'-' | b'?' | b':');
            if indicator && bytes.get(i + 1).is_none_or(|b| *b == b' ') {
                i += 1;
                continue;
            }
            break;
        }
        let block = 2 * i + 1;
        deepest = deepest.max(block + flow);
        let mut quote: Option<u8> = None;
        while i < bytes.len() {
            let b = bytes[i];
            match quote {
                Some(b'"') if b == b'\\' => i += 1,
                Some(q) if b == q => {
                    if q == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                        i += 1;
                    } else {
                        quote = None;
                    }
                }
                Some(_) => {}
                None => match b {
                    b'#' if i == 0 || matches!(bytes[i - 1], b' ' | b'\t') => break,
                    b'[' | b'{' => {
                        flow += 1;
                        deepest = deepest.max(block + flow);
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    b'"' | b'\'' if starts_scalar(bytes, i, flow > 0) => quote = Some(b),
                    _ => {}
                },
            }
            i += 1;
        }
    }
    deepest
}

/// Whether a quote at `i` starts a quoted scalar: at the line's content start or after a block
/// indicator and a space; inside brackets also right after `[`, `{`, `,` (spaces between
/// allowed). Elsewhere it is a character of a plain scalar (`it's`).
fn starts_scalar(bytes: &[u8], i: usize, in_flow: bool) -> bool {
    let before = &bytes[..i];
    let trimmed = before.iter().rposition(|b| *b != b' ' && *b != b'\t');
    match trimmed {
        None => true,
        Some(at) => {
            let spaced = at + 1 < i;
            match bytes[at] {
                b'-' | b'?' | b':' => spaced,
                b'[' | b'{' | b',' => in_flow,
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_never_below_the_depth_and_near_it_for_real_configs() {
        let config = "domain: d\ndescriptors:\n  - key: a\n    value: \"it's [x\"\n    descriptors:\n      - {key: b, rate_limit: {unit: day}}\n";
        assert!(serde_yaml::from_str::<serde_yaml::Value>(config).is_ok());
        let bound = nesting_bound(config);
        // root map, list, map, list, flow map, flow map: 6 levels.
        assert!((6..=20).contains(&bound), "{bound}");
        // Flow nesting counts each bracket; closes bring it back.
        assert_eq!(nesting_bound(&format!("{}{}", "[".repeat(50), "]".repeat(50))), 51);
        assert_eq!(nesting_bound(&"[a]\n".repeat(1000)), 2);
        // A compact list on one line.
        assert!(nesting_bound(&format!("{}x", "- ".repeat(40))) >= 40);
    }

    #[test]
    fn quotes_cannot_hide_brackets_beyond_their_line() {
        // A quoted `]` closes nothing; a quote misread (here a plain scalar's) hides its line only.
        assert_eq!(nesting_bound("a: [[[\"]]]\"\n"), 4);
        assert_eq!(nesting_bound("a: ['it''s ]]', [[x]]]\n"), 4);
        let hidden = format!("a: x 'y\nb: {}", "[".repeat(2000));
        assert!(nesting_bound(&hidden) > MAX_NESTING);
        let commented = format!("a: 1 # {}\n", "[".repeat(2000));
        assert_eq!(nesting_bound(&commented), 1);
    }
}
