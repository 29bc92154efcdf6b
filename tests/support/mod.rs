//! Shared harness for integration tests: real processes over real sockets.
#![allow(dead_code)]

pub mod redis_server;
