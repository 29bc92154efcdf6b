//! Where the config's text comes from: files on disk with their `include`s, or the output of
//! `nginx -T` (every file nginx read, each after a `# configuration file PATH:` line). Includes
//! are expanded in place, as nginx does, with globs and relative paths resolved against the
//! main file's directory (nginx's conf prefix).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::lexer::{self, Directive};

/// Includes nested deeper than this are refused (nginx has no limit, but a loop never ends).
const MAX_INCLUDE_DEPTH: usize = 32;

/// What the loader reads files from.
pub trait Files {
    fn read(&self, path: &str) -> Result<String, String>;
    /// The files a glob names, sorted (nginx sorts glob results).
    fn glob(&self, pattern: &str) -> Result<Vec<String>, String>;
}

/// The real file system.
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &str) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
    }

    fn glob(&self, pattern: &str) -> Result<Vec<String>, String> {
        let path = Path::new(pattern);
        let (dir, name) = (path.parent().unwrap_or(Path::new(".")), path.file_name().map(|n| n.to_string_lossy()));
        let name = name.unwrap_or_default();
        if has_glob(&dir.to_string_lossy()) {
            return Err(format!("include {pattern}: a glob in a directory name is not supported; run `nginx -T`"));
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            // nginx: a glob that matches nothing (even in a missing directory) is fine.
            Err(_) => return Ok(Vec::new()),
        };
        let mut out: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && glob_match(&name, n))
            .map(|n| dir.join(n).to_string_lossy().into_owned())
            .collect();
        out.sort();
        Ok(out)
    }
}

/// The files of an `nginx -T` dump, by the path nginx printed.
pub struct Dump {
    pub files: BTreeMap<String, String>,
    pub main: String,
}

impl Files for Dump {
    fn read(&self, path: &str) -> Result<String, String> {
        self.files.get(path).cloned().ok_or_else(|| format!("{path} is included but not in the `nginx -T` output"))
    }

    fn glob(&self, pattern: &str) -> Result<Vec<String>, String> {
        let (dir, name) = pattern.rsplit_once('/').unwrap_or(("", pattern));
        Ok(self
            .files
            .keys()
            .filter(|k| k.rsplit_once('/').is_some_and(|(d, n)| d == dir && glob_match(name, n)))
            .cloned()
            .collect())
    }
}

/// Splits `nginx -T` output into its files; `None` if the text is not such output.
pub fn split_dump(text: &str) -> Option<Dump> {
    const MARK: &str = "# configuration file ";
    let mut files = BTreeMap::new();
    let mut main = None;
    let mut current: Option<(String, String)> = None;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if let Some(path) = bare.strip_prefix(MARK).and_then(|p| p.strip_suffix(':')) {
            if let Some((p, t)) = current.take() {
                files.insert(p, t);
            }
            main.get_or_insert_with(|| path.to_string());
            current = Some((path.to_string(), String::new()));
        } else if let Some((_, t)) = current.as_mut() {
            t.push_str(line);
        }
        // Lines before the first marker are nginx's "syntax is ok" messages.
    }
    if let Some((p, t)) = current.take() {
        files.insert(p, t);
    }
    Some(Dump { files, main: main? })
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Shell-style `*` and `?` (what nginx configs use in `include`).
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The main file parsed, every `include` replaced by the directives of the files it names.
pub fn load(files: &dyn Files, main: &str) -> Result<Vec<Directive>, String> {
    let prefix = Path::new(main).parent().map(Path::to_path_buf).unwrap_or_default();
    let text = files.read(main)?;
    let parsed = lexer::parse(main, &text)?;
    expand(files, &prefix, parsed, &mut vec![main.to_string()])
}

fn expand(
    files: &dyn Files,
    prefix: &Path,
    list: Vec<Directive>,
    stack: &mut Vec<String>,
) -> Result<Vec<Directive>, String> {
    let mut out = Vec::with_capacity(list.len());
    for mut d in list {
        if d.name == "include" && d.block.is_none() {
            let pattern = d.arg(0);
            let full: PathBuf =
                if Path::new(pattern).is_absolute() { PathBuf::from(pattern) } else { prefix.join(pattern) };
            let full = full.to_string_lossy().into_owned();
            let names =
                if has_glob(pattern) { files.glob(&full).map_err(|e| format!("{}: {e}", d.at))? } else { vec![full] };
            for name in names {
                if stack.contains(&name) || stack.len() > MAX_INCLUDE_DEPTH {
                    return Err(format!(
                        "{}: include {name}: includes itself (or nests over {MAX_INCLUDE_DEPTH} deep)",
                        d.at
                    ));
                }
                let text = files.read(&name).map_err(|e| format!("{}: {e}", d.at))?;
                let parsed = lexer::parse(&name, &text)?;
                stack.push(name);
                out.extend(expand(files, prefix, parsed, stack)?);
                stack.pop();
            }
            continue;
        }
        if let Some(block) = d.block.take() {
            d.block = Some(expand(files, prefix, block, stack)?);
        }
        out.push(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "nginx: the configuration file /etc/nginx/nginx.conf syntax is ok\n\
nginx: configuration file /etc/nginx/nginx.conf test is successful\n\
# configuration file /etc/nginx/nginx.conf:\n\
events {}\nhttp {\n    include /etc/nginx/conf.d/*.conf;\n    include limits.inc;\n}\n\n\
# configuration file /etc/nginx/conf.d/b.conf:\nserver { listen 81; }\n\n\
# configuration file /etc/nginx/conf.d/a.conf:\nserver {\n    listen 80;\n}\n\n\
# configuration file /etc/nginx/limits.inc:\nlimit_req_zone $binary_remote_addr zone=z:1m rate=1r/s;\n";

    #[test]
    fn dump_is_split_and_includes_expand_in_glob_order_with_their_own_lines() {
        let dump = split_dump(DUMP).unwrap();
        assert_eq!(dump.main, "/etc/nginx/nginx.conf");
        assert_eq!(dump.files.len(), 4);
        let top = load(&dump, &dump.main.clone()).unwrap();
        let http = top[1].block.as_ref().unwrap();
        let names: Vec<String> = http.iter().map(|d| format!("{} {}", d.name, d.at)).collect();
        assert_eq!(
            names,
            [
                "server /etc/nginx/conf.d/a.conf:1",
                "server /etc/nginx/conf.d/b.conf:1",
                "limit_req_zone /etc/nginx/limits.inc:1"
            ]
        );
        assert!(split_dump("http {}\n").is_none());
    }

    #[test]
    fn include_loops_and_missing_files_are_refused_at_the_include() {
        let mut files = BTreeMap::new();
        files.insert("/c/n.conf".to_string(), "http {\n include self.conf;\n}\n".to_string());
        files.insert("/c/self.conf".to_string(), "include self.conf;\n".to_string());
        let dump = Dump { files, main: "/c/n.conf".into() };
        let e = load(&dump, "/c/n.conf").unwrap_err();
        assert!(e.starts_with("/c/self.conf:1: include /c/self.conf: includes itself"), "{e}");
        let mut files = BTreeMap::new();
        files.insert("/c/n.conf".to_string(), "http {\n include gone.conf;\n}\n".to_string());
        let e = load(&Dump { files, main: "/c/n.conf".into() }, "/c/n.conf").unwrap_err();
        assert!(e.starts_with("/c/n.conf:2:") && e.contains("gone.conf"), "{e}");
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.conf", "a.conf"));
        assert!(!glob_match("*.conf", "a.conf.bak"));
        assert!(glob_match("site-?", "site-1"));
        assert!(glob_match("*", "x"));
    }
}
