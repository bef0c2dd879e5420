//! `/ui`: the read-only browser view (its page, files and data routes).
//!
//! All logic is in [`metal_ipam_core::observe`]. The page and its files
//! hold no data and no secret: the shell answers them without a token or
//! the store ([`metal_ipam_core::http::dispatch::ui_files`], the
//! component's public routes); the data routes under `/ui/api/` are
//! authenticated first, as every other route.

metal_ipam_spin::component!(Ui, ui, ui_files);
