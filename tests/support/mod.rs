//! Shared harness for integration tests: real processes over real sockets.
#![allow(dead_code)]

pub mod http;
pub mod redis_server;
pub mod upstream;
pub mod weir;
