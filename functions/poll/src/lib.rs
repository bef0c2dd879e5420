//! The Metal event poll: `POST /v1/metal/poll`, run by a CronJob (Metal
//! has no webhooks), handles the project's events after the cursor kept in
//! the store: a deleted device's claims lose their assignment, an active
//! device gets its claims' pending ones. Holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::poll`]; the glue
//! in [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Poll, poll);
