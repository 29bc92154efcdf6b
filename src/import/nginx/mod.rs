//! `weir import-nginx PATH…`: an nginx config (with its `include`s, or the output of `nginx -T`)
//! as one Weir TOML. `lexer` reads nginx's grammar, `files` finds the text (includes, `-T`
//! dumps), `model` keeps what decides a request (zones, servers, locations, inheritance),
//! `keys` turns zone keys (`map`/`geo` chains too) into Weir keys and overrides, and `translate`
//! writes the TOML in nginx's selection order, every zone and route naming its file:line.

pub mod files;
pub mod keys;
pub mod lexer;
pub mod model;
pub mod translate;

pub use translate::{Imported, Options};

/// Imports `mains` (each a main file or a site file; a `nginx -T` dump is recognised by its
/// `# configuration file` lines) read through `read`.
pub fn import(inputs: &[(String, String)], disk: &dyn files::Files, opts: &Options) -> Result<Imported, String> {
    let mut top = Vec::new();
    let mut names = Vec::new();
    for (name, text) in inputs {
        if let Some(dump) = files::split_dump(text) {
            names.push(format!("{name} (nginx -T of {})", dump.main));
            let main = dump.main.clone();
            top.extend(files::load(&dump, &main)?);
        } else {
            names.push(name.clone());
            top.extend(files::load(disk, name)?);
        }
    }
    let http = model::read(&top)?;
    translate::translate(&http, &names, opts)
}
