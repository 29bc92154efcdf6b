//! Weir: a rate-limiting reverse proxy. The modules follow the data path of one request:
//! `edge` (connections) → `proxy` (the Pingora front door) → `engine` (request facts → plan →
//! verdict, shared with `replay`), which reads `request`, `routes` and `keys` over the compiled
//! `config`, and decides with the model `limit` in a `store` (memory | redis); `upstream` forwards.
//! `process` assembles them into a Pingora server and owns what outlives a reload.

pub mod adaptive;
pub mod buffering;
pub mod config;
pub mod edge;
pub mod engine;
pub mod fswatch;
pub mod import;
pub mod keys;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod replay;
pub mod request;
pub mod rls;
pub mod routes;
pub mod safe_text;
pub mod store;
pub mod tls;
pub mod top;
pub mod trace;
pub mod tui;
pub mod upstream;
