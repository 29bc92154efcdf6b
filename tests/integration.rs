//! The integration suite as one test binary: every file beside this one is a module of it.
//!
//! One binary instead of one per file: 60 binaries of ~140 MB each filled a CI machine's disk and
//! spent minutes linking; the tests are unchanged (each still starts its own redis-server and weir
//! processes on free loopback ports). Run one file's tests with `cargo test --test integration
//! <file>::`. Two files stay binaries of their own, as they measure memory that a large test
//! process would distort: `memory_store_rss.rs` reads its own RSS, and `replay_bounds.rs` reads a
//! child's peak RSS (Linux counts the parent's high-water mark into a child spawned with vfork).

mod support;

mod adaptive;
mod algorithms;
mod bad_input;
mod bandwidth;
mod charge_by_response;
mod charge_from_response;
mod charge_on_leave;
mod check_routes;
mod cli_check;
mod config_schema;
mod deploy_files;
mod docs;
mod fleet;
mod header_bytes;
mod hostile_clients;
mod hostile_doors;
mod hostile_frontdoors;
mod hostile_h2;
mod hostile_rls;
mod import_cycles;
mod import_ingress;
mod import_nginx;
mod install;
mod keys;
mod kubernetes;
mod lease_differential;
mod leases;
mod limit_conn;
mod lua_charge_differential;
mod lua_compact_differential;
mod lua_differential;
mod memory_store_cap;
mod nginx_shapes;
mod observability;
mod proxy_limits;
mod proxy_real_ip;
mod redis_cluster;
mod redis_coalescing;
mod redis_eviction;
mod redis_failure;
mod redis_sentinel;
mod redis_store;
mod redis_tls;
mod reload;
mod reload_partial_write;
mod replay;
mod replay_agrees;
mod request_shapes;
mod rlqs;
mod rls;
mod rls_dropin;
mod secrets;
mod slow_readers;
mod sockets_nodelay;
mod status_page;
mod tls;
mod top_keys;
mod top_tui;
mod tracing_otel;
mod upstream_tls;
mod upstream_unix;
mod upstreams;
mod websocket;
