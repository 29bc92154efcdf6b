//! Weir: a rate-limiting reverse proxy. The modules follow the data path of one request:
//! `config` → `routes` → `keys` → `limit` (the model) → `store` (memory | redis) → `proxy`.

pub mod limit;
pub mod store;
