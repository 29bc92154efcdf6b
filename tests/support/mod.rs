//! Shared harness for integration tests: real processes over real sockets.
#![allow(dead_code)]

pub mod access_log;
pub mod admin;
pub mod certs;
pub mod concurrent;
pub mod config;
pub mod differential;
pub mod grpc_server;
pub mod h2;
pub mod http;
pub mod kustomize;
pub mod metrics;
pub mod nginx;
pub mod nginx_differential;
pub mod poll;
pub mod ratelimit;
pub mod redis_cmd;
pub mod redis_server;
pub mod redis_topology;
pub mod replay;
pub mod rls_client;
pub mod tcp_server;
pub mod upstream;
pub mod weir;
