//! The layout has floors: no import circle among `src/`'s top-level modules, nor among the files
//! of one folder. A circle means neither side can be read, tested or moved without the other
//! (issue 49 opened two: `config` ↔ `metrics`, and `config/interpolate.rs` ↔ `config/secrets.rs`).
//!
//! Read from the source text, as a reader follows it: a file of module `a` naming `crate::b` is an
//! arrow a → b; a file naming `super::sibling` (a module file beside it) is an arrow between the
//! two files. Names handed on by a folder's `mod.rs` (`super::Name`) are not arrows to a sibling.
//! Test code (`#[cfg(test)]` items and the files of test-only modules) may reach up, and is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text` without comments, strings and character literals, so prose or a test's
/// TOML naming a path is no arrow.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if let Some((opening, hashes)) = raw_string_start(text, i) {
            let close = format!("\"{}", "#".repeat(hashes));
            i += opening + rest[opening..].find(&close).map_or(rest.len() - opening, |e| e + close.len());
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i] == b'\'' && rest.len() >= 3 && (b[i + 1] == b'\\' || b[i + 2] == b'\'') {
            // A character literal ('"', '\\', '\''); a lifetime ('a) has no closing quote.
            let skip = if b[i + 1] == b'\\' { rest[2..].find('\'').map_or(rest.len(), |e| e + 3) } else { 3 };
            i += skip;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Where a raw string starts at `at` (`r"…"`, `r#"…"#`, `br#"…"#`): the length of its opening
/// and its number of `#`.
fn raw_string_start(text: &str, at: usize) -> Option<(usize, usize)> {
    let before = text[..at].chars().next_back();
    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let rest = &text[at..];
    let prefix = if rest.starts_with("br") {
        2
    } else if rest.starts_with('r') {
        1
    } else {
        return None;
    };
    let hashes = rest[prefix..].chars().take_while(|c| *c == '#').count();
    rest[prefix + hashes..].starts_with('"').then_some((prefix + hashes + 1, hashes))
}

/// `code` without its `#[cfg(test)]` items, and the names of the modules declared test-only
/// (`#[cfg(test)] mod sim;`), whose files are test code too.
fn without_test_items(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut test_modules = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        // The item ends at its first `;` outside braces, or where its first brace closes.
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        let words: Vec<&str> = item[..end].split_whitespace().collect();
        if let Some(name) = words.iter().position(|w| *w == "mod").and_then(|i| words.get(i + 1)) {
            test_modules.push(name.trim_end_matches(';').to_string());
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_modules)
}

/// The identifiers that follow `prefix` in `code`: `crate::a::b` and `crate::{a, b::c}` give `a`
/// (and `b`) for the prefix `crate::`.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    names.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// A circle in `graph`, as the nodes along it, if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|n| n == node).unwrap_or(0);
                let mut circle = path[from..].to_vec();
                circle.push(node.to_string());
                return Some(circle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, marks, path) {
                return Some(circle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(circle);
        }
    }
    None
}

struct Source {
    /// Path under `src/`, e.g. `config/secrets.rs`.
    relative: PathBuf,
    code: String,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut test_only: BTreeSet<PathBuf> = BTreeSet::new();
    let mut all = Vec::new();
    for path in files {
        let relative = path.strip_prefix(src()).expect("under src/").to_path_buf();
        let text = std::fs::read_to_string(&path).expect("read a source file");
        let (code, test_modules) = without_test_items(&code_only(&text));
        // A test-only module's file sits beside a plain file or in the folder a mod.rs owns.
        let folder = match relative.file_name().and_then(|f| f.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => relative.parent().unwrap_or(Path::new("")).to_path_buf(),
            _ => relative.with_extension(""),
        };
        for name in test_modules {
            test_only.insert(folder.join(format!("{name}.rs")));
            test_only.insert(folder.join(&name).join("mod.rs"));
        }
        all.push(Source { relative, code });
    }
    all.retain(|s| !test_only.contains(&s.relative));
    all
}

/// The top-level module a file belongs to (`config/secrets.rs` → `config`, `routes.rs` → `routes`).
fn top_module(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// The module files of one folder, by module name (`secrets` → `config/secrets.rs` or
/// `config/secrets/mod.rs`).
fn modules_of(folder: &Path, all: &[Source]) -> BTreeMap<String, PathBuf> {
    all.iter()
        .filter_map(|s| {
            let rel = &s.relative;
            if rel.parent() == Some(folder) && rel.file_name()? != "mod.rs" {
                return Some((rel.file_stem()?.to_str()?.to_string(), rel.clone()));
            }
            if rel.file_name()? == "mod.rs" && rel.parent()?.parent() == Some(folder) {
                return Some((rel.parent()?.file_name()?.to_str()?.to_string(), rel.clone()));
            }
            None
        })
        .collect()
}

/// Arrows between top-level modules.
fn module_graph(all: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let tops: BTreeSet<String> = all.iter().filter_map(|s| top_module(&s.relative)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in all {
        let Some(from) = top_module(&s.relative) else { continue };
        for to in names_after(&s.code, "crate::") {
            if to != from && tops.contains(&to) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// Arrows between the files of one folder, through `super::sibling`.
fn sibling_graph(all: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in all {
        // The folder whose files are this file's siblings: a `mod.rs`'s `super` is its folder's parent.
        let own_folder = s.relative.parent().unwrap_or(Path::new(""));
        let folder = if s.relative.file_name().is_some_and(|f| f == "mod.rs") {
            own_folder.parent().unwrap_or(Path::new(""))
        } else {
            own_folder
        };
        let siblings = modules_of(folder, all);
        for name in names_after(&s.code, "super::") {
            if let Some(to) = siblings.get(&name) {
                if to != &s.relative {
                    let from = s.relative.display().to_string();
                    graph.entry(from).or_default().insert(to.display().to_string());
                }
            }
        }
    }
    graph
}

#[test]
fn no_import_circle_among_the_top_level_modules() {
    let all = sources();
    let graph = module_graph(&all);
    assert!(graph.len() > 10, "the scan found the modules' arrows: {graph:?}");
    assert!(graph.get("proxy").is_some_and(|to| to.contains("engine")), "proxy → engine is seen");
    if let Some(circle) = find_circle(&graph) {
        panic!("an import circle among src/'s modules: {}", circle.join(" → "));
    }
}

#[test]
fn no_import_circle_among_the_files_of_a_folder() {
    let all = sources();
    let graph = sibling_graph(&all);
    assert!(
        graph.get("config/store.rs").is_some_and(|to| to.contains("config/secrets.rs")),
        "config/store.rs → config/secrets.rs is seen: {:?}",
        graph.get("config/store.rs")
    );
    if let Some(circle) = find_circle(&graph) {
        panic!("an import circle among one folder's files: {}", circle.join(" → "));
    }
}

#[test]
fn the_scan_sees_a_circle_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(find_circle(&graph), Some(vec!["a", "b", "c", "a"].into_iter().map(String::from).collect()));
    let code = code_only(
        "use crate::{config, metrics::Meters};\nlet x = crate::store::X; // crate::top\nlet s = \"crate::tui\";",
    );
    let (code, test_modules) =
        without_test_items(&format!("{code}\n#[cfg(test)]\nmod sim;\n#[cfg(test)]\nmod tests {{ use crate::proxy; }}"));
    assert_eq!(test_modules, ["sim", "tests"]);
    let names = names_after(&code, "crate::");
    assert_eq!(names, BTreeSet::from(["config".to_string(), "metrics".to_string(), "store".to_string()]));
}
