//! # metal-ipam-host
//!
//! A wasmtime 48 component host that runs metal-ipam's `spin.toml` the way
//! `spin up` (Spin 3.6) does, for local runs and tests where Spin itself is
//! not available. It provides WASI 0.2 and `wasi:http` (wasmtime-wasi and
//! wasmtime-wasi-http), `fermyon:spin/key-value@2.0.0`,
//! `fermyon:spin/variables@2.0.0` and
//! `wasi:keyvalue/{store,atomics,batch}@0.2.0-draft2`, with the generated
//! bindings of world `metal-ipam:platform/host-imports` (`/work/main/wit`).
//!
//! - [`HostBuilder`] / [`Host`] — load a manifest, handle requests in-process
//!   ([`Host::handle`]) or serve them over HTTP/1 ([`Host::serve`]).
//! - [`manifest`] — strict `spin.toml` v2 parsing (unsupported keys are
//!   errors).
//! - [`routing`] — Spin 3 routing and the `spin-*` request headers.
//! - [`variables`] — application/component variables.
//! - [`outbound`] — `allowed_outbound_hosts` and service chaining hosts.
//! - [`kv`] — key-value stores with the semantics and quirks of Spin's
//!   SQLite and Redis backends.
//! - [`runtime_config`] — `[key_value_store.<label>]` runtime configuration.
//! - [`build`] — running the manifest's build commands (`--build`).
//! - [`test_redis`] — finding or starting a Redis server for tests.
//!
//! ## Command line
//!
//! ```text
//! metal-ipam-host up [-f|--from spin.toml] [--listen 127.0.0.1:3000] [--build]
//!                    [--variable NAME=VALUE]... [--kv-file PATH | --kv-memory]
//!                    [--runtime-config-file PATH] [--redis-swap MODE]
//!                    [-c|--component-id ID]...
//! ```
//!
//! `cargo run -p metal-ipam-host -- up --variable api_token=dev` from the
//! workspace root serves `spin.toml`. The default key-value file is
//! `<manifest dir>/.spin/sqlite_key_value.db`, as with `spin up`. Startup
//! prints the stores, the variables (secret values as `<secret>`), the
//! listen address and the routes; component stdout and stderr go to the
//! host's stderr. Ctrl-C or SIGTERM stops accepting connections and waits
//! up to [`SHUTDOWN_GRACE`] for in-flight requests.
//!
//! ## Service chaining
//!
//! An outbound request to `http://<component-id>.spin.internal/<path>` is
//! handled in-process by that component, as in Spin 3.6 ("local service
//! chaining"):
//! - the caller's `allowed_outbound_hosts` must allow it like any other
//!   URL (`http://<id>.spin.internal` or `http://*.spin.internal`; scheme
//!   and port count), else `ErrorCode::HttpRequestDenied`;
//! - the target is the component named by the host (the first label, as
//!   written), whatever its routes: a component whose only trigger is
//!   `route = { private = true }` is reachable this way (and only this
//!   way). If the id names no component with an HTTP trigger (or one left
//!   out by `--component-id`), the **caller traps** (`unknown routing
//!   destination '<id>'`) and its request gets a 500; it is not an error
//!   code the caller could handle;
//! - the callee runs in a fresh instance with its own key-value stores,
//!   variables and `allowed_outbound_hosts`; it gets the method, path,
//!   query, headers (without `Host`) and body, and the `spin-*` headers of
//!   a synthetic `/...` match: `spin-path-info` is the whole path,
//!   `spin-matched-route` and `spin-raw-component-route` are `/...`,
//!   `spin-component-route` is empty, `spin-full-url` is
//!   `http://localhost<path?query>` and `spin-client-addr` is
//!   [`CHAINED_CLIENT_ADDR`] (`0.0.0.0:0`);
//! - a failure of the callee is a 500 response to the caller;
//! - with `--component-id` ([`HostBuilder::retain_components`]), a retained
//!   component may not name an unretained target, nor use
//!   `*.spin.internal` (a startup error, with Spin's messages).
//!
//! Requests to the application by route (relative URLs, `http://self.alt`)
//! are not supported: `self` / `self.alt` entries in
//! `allowed_outbound_hosts` are rejected at load, so such requests are
//! denied (as Spin denies them to a component that does not allow `self`).
//! Spin sends them over the network to its own listen address; an
//! in-process [`Host::handle`] has none.
//!
//! ## Test-host additions (not Spin behaviour)
//!
//! Every response carries `x-kv-ops: <n>` (the number of key-value data
//! operations the request made) and `x-kv-ops-detail: get=1,cas.swap=1,...`
//! (non-zero counts by operation); in-process callers get the same counts
//! as [`RequestOutcome::kv_ops`]. See [`KvOpCounts`] for what is counted.
//! These count the component that handled the request only: the
//! operations of its service chaining requests are reported separately, per
//! call, in [`RequestOutcome::chained`] ([`ChainedCall`]: caller, callee,
//! method, path, status, key-value counts) and, in total, in the
//! `x-kv-ops-chained: <n>` header of a response whose request made chained
//! requests. [`RequestOutcome::total_kv_ops`] adds them up. Chained
//! responses themselves carry none of these headers.
//!
//! ## Known deviations from Spin 3.6
//!
//! - Responses are buffered in full before they are returned (Spin
//!   streams), and the host waits for the guest to return before answering
//!   so that the key-value counts are complete.
//! - A guest error after the response body was fully produced is logged and
//!   the response returned (as Spin); if the body is cut short, the client
//!   gets a 500 instead of a truncated response.
//! - Routing re-implements routefinder's ordering for exact, `:param` and
//!   trailing `/...` patterns only; other routefinder syntax is rejected.
//! - Variables are resolved once at startup; no `.env`, Vault or Azure
//!   providers. An explicit value for an undeclared variable is an error.
//! - Unknown `key_value_stores` labels are a startup error (as Spin); store
//!   types other than `spin` (SQLite) and `redis` are not supported, nor is
//!   TLS to Redis (`rediss://`). Unknown runtime-config options are errors
//!   here (Spin ignores unknown options of a `redis` store).
//! - Redis: a compare-and-swap handle made through the Rust API with
//!   [`kv::KvStore::new_cas`] connects on first use; components get
//!   Spin's behaviour (connect at `cas.new`).
//! - Key-value write transactions are `BEGIN IMMEDIATE` so that several
//!   host processes can share one SQLite file; Spin's 128 MiB read limit is
//!   not enforced.
//! - A service chaining request to a component without an HTTP trigger
//!   traps the caller in `outgoing-handler.handle`; Spin traps a little
//!   later, when the caller asks for the response
//!   (`future-incoming-response.get`). Either way the caller never sees a
//!   result.
//! - A chained response is buffered in full before the caller sees it
//!   (Spin streams it from the callee).
//! - `self` / `self.alt` outbound hosts (requests by route to the
//!   application itself) are rejected; see above.
//! - In-process requests without an authority get `Host: localhost`.
//! - `/.well-known/spin/health` and `/info` are answered; there are no
//!   request timeouts, instance reuse or resource limits.

#![warn(missing_docs)]

mod bindings;
pub mod build;
mod host;
pub mod kv;
pub mod manifest;
pub mod outbound;
mod outbound_hooks;
pub mod routing;
pub mod runtime_config;
mod server;
pub mod test_redis;
pub mod variables;

pub use host::{
    ChainedCall, Host, HostBuilder, RequestOutcome, ServerHandle, CHAINED_CLIENT_ADDR,
    GUEST_MEMORY_HEADER, IN_PROCESS_CLIENT_ADDR, KV_OPS_CHAINED_HEADER, KV_OPS_DETAIL_HEADER,
    KV_OPS_HEADER, SHUTDOWN_GRACE,
};
pub use kv::{KvBackend, KvOpCounts, RedisSwap};
