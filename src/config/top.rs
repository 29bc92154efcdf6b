//! Compilation of `[top]`: the per-zone tables of the hottest keys (`src/top/`).

use std::time::Duration;

use super::checks::parse_duration;
use super::error::{ConfigError, Source};
use super::schema;
use super::spanned::Spanned;

/// `[top]`, compiled. On by default: its cost is paid only by requests at or near their limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopSettings {
    pub enabled: bool,
    /// Keys listed per zone (the table's entries).
    pub keys: usize,
    /// Counts halve every `half_life`; rates cover about `half_life / ln 2`.
    pub half_life: Duration,
    /// A passed request is recorded only when its limit is at least this full (0..=1).
    pub near: f64,
    /// Show keys of `header:`, `query:`, `cookie:` and `jwt:` parts as they are instead of hashed.
    pub reveal_keys: bool,
    /// Cells per row of the admission sketch (memory: 16 bytes each, per zone, once its table is full).
    pub sketch_width: usize,
}

impl Default for TopSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            keys: 64,
            half_life: Duration::from_secs(30),
            near: 0.5,
            reveal_keys: false,
            sketch_width: 16_384,
        }
    }
}

pub fn compile_top(src: &Source<'_>, top: Option<Spanned<schema::Top>>) -> Result<TopSettings, ConfigError> {
    let defaults = TopSettings::default();
    let Some(top) = top else { return Ok(defaults) };
    let schema::Top { enabled, keys, half_life, near, reveal_keys, sketch_width } = top.into_inner();
    let keys = match keys {
        None => defaults.keys,
        Some(k) if (1..=10_000).contains(k.get_ref()) => *k.get_ref() as usize,
        Some(k) => return Err(src.error_at(&k.span(), format!("top.keys must be 1..=10000, got {}", k.get_ref()))),
    };
    let half_life = match half_life {
        None => defaults.half_life,
        Some(h) => {
            parse_duration(h.get_ref()).filter(|d| d.as_millis() >= 100 && d.as_secs() <= 3600).ok_or_else(|| {
                src.error_at(
                    &h.span(),
                    format!(
                        "top.half_life: expected a duration from \"100ms\" to \"1h\" like \"30s\", got {:?}",
                        h.get_ref()
                    ),
                )
            })?
        }
    };
    let near = match near {
        None => defaults.near,
        Some(n) if (0.0..=1.0).contains(n.get_ref()) => *n.get_ref(),
        Some(n) => return Err(src.error_at(&n.span(), format!("top.near must be 0.0..=1.0, got {}", n.get_ref()))),
    };
    let sketch_width = match sketch_width {
        None => defaults.sketch_width,
        Some(w) if (64..=1 << 24).contains(w.get_ref()) => *w.get_ref() as usize,
        Some(w) => {
            return Err(src.error_at(&w.span(), format!("top.sketch_width must be 64..=16777216, got {}", w.get_ref())))
        }
    };
    Ok(TopSettings {
        enabled: enabled.unwrap_or(defaults.enabled),
        keys,
        half_life,
        near,
        reveal_keys: reveal_keys.unwrap_or(defaults.reveal_keys),
        sketch_width,
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Wrapper {
        top: Option<Spanned<schema::Top>>,
    }

    fn compile(text: &str) -> Result<TopSettings, ConfigError> {
        let wrapper: Wrapper = toml::from_str(text).expect("valid TOML");
        compile_top(&Source { file: "t.toml", text, outside: &crate::config::Fixed::default() }, wrapper.top)
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(compile("").unwrap(), TopSettings::default());
        let t = compile(
            "[top]\nenabled = false\nkeys = 10\nhalf_life = \"5s\"\nnear = 0.9\nreveal_keys = true\nsketch_width = 1024\n",
        )
        .unwrap();
        assert_eq!(
            t,
            TopSettings {
                enabled: false,
                keys: 10,
                half_life: Duration::from_secs(5),
                near: 0.9,
                reveal_keys: true,
                sketch_width: 1024
            }
        );
    }

    #[test]
    fn bad_values_name_their_line() {
        for (text, want) in [
            ("[top]\nkeys = 0\n", "t.toml:2: top.keys must be 1..=10000"),
            ("[top]\n\nhalf_life = \"10\"\n", "t.toml:3: top.half_life"),
            ("[top]\nnear = 1.5\n", "t.toml:2: top.near must be 0.0..=1.0"),
            ("[top]\nsketch_width = 8\n", "t.toml:2: top.sketch_width"),
        ] {
            let e = compile(text).expect_err(text).to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
