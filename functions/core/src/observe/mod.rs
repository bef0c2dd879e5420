//! What operators look at: the Prometheus exposition and the browser
//! view's data, read from the store; and the request counters every
//! component keeps.
//!
//! - [`counters`]: one atomic increment per request, of the key named by
//!   what the request did (its signature), and the registry that lists the
//!   signatures seen; read back as Prometheus counters.
//! - [`summary`]: what the last full reconcile saw (claims waiting, machines,
//!   Metal assignments), one record written by `capi::reconcile`.
//! - [`metrics`]: the exposition (text format 0.0.4) from pool records,
//!   VRF-backed pools' progress, the poll cursor, the summary and the
//!   counters: a bounded number of keys per scrape.
//! - [`view`]: the browser view's data (JSON) and [`ui`] its page and files.
//!
//! Reads the stored records of `ipam`, `provision` and `network`; nothing
//! here writes a record those modules own. Sits below `reconcile` and
//! `capi` (which write the summary) and `http` (which serves it).

pub mod counters;
pub mod metrics;
pub mod summary;
pub mod ui;
pub mod view;
