//! Weir: a rate-limiting reverse proxy. The modules follow the data path of one request:
//! `config` → `routes` → `keys` → `limit` (the model) → `store` (memory | redis) → `proxy`,
//! with `server` assembling them into a Pingora server.

pub mod admin;
pub mod config;
pub mod echo;
pub mod edge;
pub mod fswatch;
pub mod keys;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod replay;
pub mod request;
pub mod rls;
pub mod routes;
pub mod server;
pub mod store;
pub mod tls;
pub mod upstream;
