//! Ports: the traits the shells implement, so that everything else in this
//! crate runs natively in tests and in Spin alike.
//!
//! - [`kv`]: the key-value store ([`kv::KvStore`], on `wasi:keyvalue` in
//!   Spin) and an operation counter.
//! - [`http`]: outbound HTTP ([`http::HttpClient`], on `wasi:http`).
//! - [`Env`]: time, randomness and waiting.
//!
//! Imports nothing from the rest of the crate but [`crate::error`].

pub mod http;
pub mod kv;

mod env;

pub use env::Env;
