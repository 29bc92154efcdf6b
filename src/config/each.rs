//! A list section (`[[upstream]]`, `[[limit_req_zone]]`, `[[limit_conn_zone]]`, `[[route]]`)
//! compiled item by item, so that `weir check` reports an error in every item, not only in the
//! first: an item stops at its own first error, the next item is compiled all the same.
//!
//! An item that failed is left out, but its name is kept (`broken`): a route that refers to it
//! is not told "unknown zone" as well, which would only repeat the zone's own error.

use std::collections::HashSet;

use super::error::ConfigError;

/// The items of one list that compiled, the names of those that did not, and their errors.
#[derive(Debug)]
pub struct Each<T> {
    pub items: Vec<T>,
    pub errors: Vec<ConfigError>,
    /// Names no item compiled under (a duplicate's error leaves its name to the first).
    broken: HashSet<String>,
    compiled: HashSet<String>,
}

impl<T> Default for Each<T> {
    fn default() -> Self {
        Each { items: Vec::new(), errors: Vec::new(), broken: HashSet::new(), compiled: HashSet::new() }
    }
}

/// Why an item that names others (a route) did not compile.
#[derive(Debug)]
pub enum Failed {
    Error(ConfigError),
    /// It names an item whose own definition failed; that item's error says what to fix.
    Broken,
}

impl From<ConfigError> for Failed {
    fn from(e: ConfigError) -> Self {
        Failed::Error(e)
    }
}

impl<T> Each<T> {
    /// Keeps the item `name` if it compiled, else its error and its name.
    pub fn push(&mut self, name: &str, result: Result<T, ConfigError>) {
        match result {
            Ok(item) => {
                self.items.push(item);
                self.broken.remove(name);
                self.compiled.insert(name.to_string());
            }
            Err(e) => {
                self.errors.push(e);
                if !self.compiled.contains(name) {
                    self.broken.insert(name.to_string());
                }
            }
        }
    }

    /// Whether `name` names an item whose definition failed.
    pub fn is_broken(&self, name: &str) -> bool {
        self.broken.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line: usize) -> ConfigError {
        ConfigError { file: "t.toml".into(), line: Some(line), message: "bad".into() }
    }

    #[test]
    fn keeps_what_compiled_and_names_what_did_not() {
        let mut each = Each::default();
        each.push("a", Ok(1));
        each.push("b", Err(error(4)));
        each.push("c", Ok(3));
        each.push("d", Err(error(9)));
        assert_eq!(each.items, vec![1, 3]);
        assert!(each.is_broken("b") && each.is_broken("d"));
        assert!(!each.is_broken("a") && !each.is_broken("x"));
        assert_eq!(each.errors, vec![error(4), error(9)]);
    }

    #[test]
    fn a_duplicate_leaves_its_name_to_the_first() {
        let mut each = Each::default();
        each.push("a", Ok(1));
        each.push("a", Err(error(5)));
        assert!(!each.is_broken("a"), "\"a\" names the first, which compiled");
        assert_eq!(each.errors, vec![error(5)]);
    }
}
