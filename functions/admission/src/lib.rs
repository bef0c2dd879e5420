//! `POST /v1/admission/pools`: the validating admission webhook for our pool
//! kinds (invalid specs, unsafe overlaps, updates dropping allocated
//! addresses, deletion while in use).
//!
//! All logic is in [`metal_ipam_core::admission`]; it reads the key-value
//! store and never writes it.

metal_ipam_spin::component!(Admission, admission);
