//! (being written) Request counters.
