//! The documentation is checked like code: README.md links every reference page of docs/, every
//! relative link of the Markdown files resolves (file and `#anchor`), and every metric Weir
//! registers is described in docs/operating.md. Moving a section to another file then fails here
//! instead of leaving a dead link.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use regex::Regex;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `*.md` files directly in `dir` (relative to the repository), sorted.
fn markdown_in(dir: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("list {dir}: {e}"))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    out.sort();
    out
}

/// The documents whose links are checked: the README, the reference, the bench's manual and
/// results, the deployment guide.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md"), repo().join("bench/README.md"), repo().join("deploy/README.md")];
    docs.extend(markdown_in("docs"));
    docs.extend(markdown_in("bench/results"));
    docs
}

/// The text outside fenced code blocks (a `](x)` inside a TOML or shell example is not a link).
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to '-', punctuation other than '-' and '_'
/// dropped (`The memory store's size` → `the-memory-stores-size`).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown file defines: one per heading outside code blocks.
fn anchors(text: &str) -> BTreeSet<String> {
    let heading = Regex::new(r"^#{1,6} (.+)$").unwrap();
    prose(text).lines().filter_map(|l| heading.captures(l)).map(|c| slug(&c[1])).collect()
}

#[test]
fn readme_links_every_reference_page() {
    let readme = read(&repo().join("README.md"));
    let pages = markdown_in("docs");
    assert!(pages.len() >= 8, "docs/ holds the reference: {pages:?}");
    for page in pages {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(readme.contains(&format!("](docs/{name})")), "README.md does not link docs/{name}");
    }
    for command in ["bash scripts/run.sh", "bash scripts/test.sh"] {
        assert!(readme.contains(command), "README.md shows `{command}`");
    }
    let lines = readme.lines().count();
    assert!(lines <= 400, "README.md is a newcomer's page, not the reference: {lines} lines");
}

#[test]
fn relative_links_resolve() {
    let link = Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().unwrap();
        for c in link.captures_iter(&prose(&text)) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = if path.is_empty() { doc.clone() } else { dir.join(path) };
            let shown = format!("{}: ({target})", doc.strip_prefix(repo()).unwrap().display());
            if !file.exists() {
                broken.push(format!("{shown}: no such file"));
            } else if !anchor.is_empty() {
                if file.extension().is_some_and(|x| x == "md") {
                    if !anchors(&read(&file)).contains(anchor) {
                        broken.push(format!("{shown}: no heading with anchor #{anchor}"));
                    }
                } else {
                    broken.push(format!("{shown}: an anchor into a file that is not Markdown"));
                }
            }
        }
    }
    assert!(checked >= 50, "found only {checked} relative links: is the link pattern still right?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_registered_metric_is_documented() {
    let src = read(&repo().join("src/metrics/mod.rs"));
    let names: BTreeSet<String> =
        Regex::new(r#""(weir_[a-z_]+)""#).unwrap().captures_iter(&src).map(|c| c[1].to_string()).collect();
    assert!(names.len() >= 20, "could not read the metric names out of src/metrics/mod.rs: {names:?}");
    let doc = read(&repo().join("docs/operating.md"));
    let missing: Vec<&String> = names.iter().filter(|n| !doc.contains(&format!("`{n}`"))).collect();
    assert!(missing.is_empty(), "metrics registered but not described in docs/operating.md: {missing:?}");
}
