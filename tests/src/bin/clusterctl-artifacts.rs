//! # clusterctl-artifacts
//!
//! Writes metal-ipam's clusterctl provider artifacts into deploy/clusterctl/
//! from deploy/ (see [`metal_ipam_tests::clusterctl`]):
//!
//! ```text
//! deploy/clusterctl/generate            # write them
//! deploy/clusterctl/generate --check    # exit 1 if a committed one differs
//! ```
//!
//! (`deploy/clusterctl/generate` runs `cargo run --bin clusterctl-artifacts`.)

use std::process::ExitCode;

use metal_ipam_tests::clusterctl::{stale_files, write_artifacts};
use metal_ipam_tests::schema::repo_root;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = match args.as_slice() {
        [] => false,
        [a] if a == "--check" => true,
        _ => {
            eprintln!("usage: clusterctl-artifacts [--check]");
            return ExitCode::from(2);
        }
    };
    let root = repo_root();
    if check {
        match stale_files(&root) {
            Ok(stale) if stale.is_empty() => {
                println!("deploy/clusterctl/ is up to date");
                ExitCode::SUCCESS
            }
            Ok(stale) => {
                for file in stale {
                    eprintln!("{file}: differs from what deploy/ generates");
                }
                eprintln!("run deploy/clusterctl/generate and commit the result");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("clusterctl-artifacts: {e:#}");
                ExitCode::FAILURE
            }
        }
    } else {
        match write_artifacts(&root) {
            Ok(files) => {
                for file in files {
                    println!("wrote {file}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("clusterctl-artifacts: {e:#}");
                ExitCode::FAILURE
            }
        }
    }
}
