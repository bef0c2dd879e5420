//! Running the manifest's `[component.<id>.build]` commands, as
//! `spin up --build` does: each distinct command once, with `sh -c`, in the
//! manifest directory (or the component's `workdir`).

use anyhow::{bail, Context as _};

use crate::manifest::AppManifest;

/// Runs every distinct build step of the triggered components, in order,
/// stopping at the first failure. Command output goes to the host's
/// stdout/stderr.
pub fn run_build_commands(manifest: &AppManifest) -> anyhow::Result<()> {
    let steps = manifest.build_steps();
    if steps.is_empty() {
        println!("No build commands in {}", manifest.path.display());
    }
    for (command, workdir) in steps {
        println!("Building with `{command}` in {}", workdir.display());
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(&workdir)
            .status()
            .with_context(|| {
                format!(
                    "cannot run build command `{command}` in {}",
                    workdir.display()
                )
            })?;
        if !status.success() {
            bail!("build command `{command}` failed ({status})");
        }
    }
    Ok(())
}
