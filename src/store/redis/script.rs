//! `lua/limit_req.lua`, the one script that decides `limit_req` in Redis, joined at compile time
//! from its parts in `lua/limit_req/`: the shared prelude (the protocol, constants, arithmetic,
//! clock), one part per algorithm named after it, the general path's shared zone helpers and the
//! dispatch. One text, so one SHA-1 and one `EVALSHA` per call, as before the split.
//!
//! The order is the script's and it is a cost (the header of `prelude.lua`): the leaky bucket's
//! fast paths return before the later parts define their functions, so the leaky bucket comes
//! right after the prelude. A new algorithm's part goes after the others, before `lease` (the
//! grants and give-backs of leased zones, docs/leases.md, which returns before `dispatch` for its
//! own calls) and `dispatch`.
//!
//! `lua/limit_req.lua` is the joined script, kept in the repository for what runs it outside Weir
//! (the bench's OpenResty row and Redis-cost harness, `redis-cli --eval`, the tests that load it
//! by path); a test below fails when it differs from the parts. After editing a part, rewrite it
//! with `WEIR_WRITE_LUA=1 cargo test --lib store::redis::script`.

/// Declares the parts (by name, in order) once, for both the list and the joined text.
macro_rules! limit_req_parts {
    ($first:literal $(, $name:literal)* $(,)?) => {
        /// The parts of `lua/limit_req.lua`, in order: name (`lua/limit_req/<name>.lua`), text.
        #[cfg(test)]
        pub(super) const LIMIT_REQ_PARTS: &[(&str, &str)] = &[
            ($first, include_str!(concat!("../../../lua/limit_req/", $first, ".lua"))),
            $(($name, include_str!(concat!("../../../lua/limit_req/", $name, ".lua")))),*
        ];
        /// The script: the parts in order, a newline between two (each part ends with its own).
        pub(super) const LIMIT_REQ_SCRIPT: &str = concat!(
            include_str!(concat!("../../../lua/limit_req/", $first, ".lua")),
            $("\n", include_str!(concat!("../../../lua/limit_req/", $name, ".lua"))),*
        );
    };
}

limit_req_parts!(
    "prelude",
    "leaky_bucket",
    "zone",
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "lease",
    "dispatch",
);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::*;
    use crate::limit::Algorithm;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn joined() -> String {
        LIMIT_REQ_PARTS.iter().map(|(_, text)| *text).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn the_script_is_its_parts_in_order() {
        assert_eq!(LIMIT_REQ_SCRIPT, joined());
        let names: Vec<&str> = LIMIT_REQ_PARTS.iter().map(|(name, _)| *name).collect();
        assert_eq!(names.first(), Some(&"prelude"));
        assert_eq!(names.get(1), Some(&"leaky_bucket"), "the fast paths return before the other parts run");
        assert_eq!(names.last(), Some(&"dispatch"));
        for (name, text) in LIMIT_REQ_PARTS {
            // A part is whole lines: joined with a newline, no part runs into the next one.
            assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{name}.lua must end with one newline");
            assert!(text.starts_with("-- "), "{name}.lua starts with a comment saying what it is");
        }
    }

    /// `lua/limit_req.lua` (what the bench and the tests loading it by path run) is the joined
    /// script, byte for byte. `WEIR_WRITE_LUA=1` rewrites it from the parts.
    #[test]
    fn the_committed_script_is_the_joined_parts() {
        let path = repo().join("lua/limit_req.lua");
        if std::env::var_os("WEIR_WRITE_LUA").is_some() {
            std::fs::write(&path, LIMIT_REQ_SCRIPT).expect("lua/limit_req.lua written");
        }
        let committed = std::fs::read_to_string(&path).expect("lua/limit_req.lua is readable");
        assert!(
            committed == LIMIT_REQ_SCRIPT,
            "lua/limit_req.lua is not lua/limit_req/*.lua joined: edit the parts, then run \
             `WEIR_WRITE_LUA=1 cargo test --lib store::redis::script`"
        );
    }

    #[test]
    fn every_part_in_the_directory_is_joined() {
        let on_disk: BTreeSet<String> = std::fs::read_dir(repo().join("lua/limit_req"))
            .expect("lua/limit_req/ is readable")
            .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
            .collect();
        let joined: BTreeSet<String> = LIMIT_REQ_PARTS.iter().map(|(name, _)| format!("{name}.lua")).collect();
        assert_eq!(on_disk, joined, "every file of lua/limit_req/ is a part, and only those");
    }

    /// Each algorithm has its part, named after it, which defines its `evaluate` under its name,
    /// and the dispatch's table maps the algorithm's id to it.
    #[test]
    fn every_algorithm_has_its_part_and_its_dispatch_entry() {
        let dispatch = LIMIT_REQ_PARTS.iter().find(|(name, _)| *name == "dispatch").expect("dispatch.lua").1;
        let prelude = LIMIT_REQ_PARTS[0].1;
        for algorithm in Algorithm::ALL {
            let name = algorithm.as_str();
            let (_, text) = LIMIT_REQ_PARTS
                .iter()
                .find(|(part, _)| *part == name)
                .unwrap_or_else(|| panic!("no lua/limit_req/{name}.lua"));
            assert!(text.contains(&format!("\nlocal function {name}(key, p)\n")), "{name}.lua defines {name}(key, p)");
            // `[LEAKY] = leaky_bucket,` in EVALUATE, and `LEAKY`'s value in the prelude is the id.
            let entry = dispatch
                .lines()
                .find(|line| line.trim_end().ends_with(&format!("] = {name},")))
                .unwrap_or_else(|| panic!("EVALUATE has no entry for {name}"));
            let constant = entry.trim().trim_start_matches('[').split(']').next().expect("a constant");
            assert_eq!(lua_constant(prelude, constant), Some(algorithm.id()), "{constant} is {name}'s id");
        }
    }

    /// The value of `constant` in the prelude's `local A, B, C = 0, 1, 2` lines.
    fn lua_constant(prelude: &str, constant: &str) -> Option<u8> {
        prelude.lines().find_map(|line| {
            let (names, values) = line.strip_prefix("local ")?.split_once(" = ")?;
            let names: Vec<&str> = names.split(", ").collect();
            let values: Vec<&str> = values.split(", ").collect();
            let at = names.iter().position(|n| *n == constant)?;
            values.get(at)?.trim().parse().ok()
        })
    }
}
