//! The process: what runs once per start and what outlives a reload. `server` assembles the
//! Pingora services; `lasting` owns what outlives a reload (stores, upstream pools and adaptive
//! limits, certificates, the live view's tables, the fleet sync); `reload` swaps config snapshots; `admin` is the admin listener (`admin_guard`: what it trusts of a request); `echo` the
//! built-in upstream for a first try.

pub mod admin;
mod admin_guard;
pub mod echo;
mod implied_series;
pub mod lasting;
mod metrics_observer;
pub mod reload;
pub mod server;
