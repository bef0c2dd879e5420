//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF
//! Distribution registry, 2.8) started on a free loopback port, and the
//! check that what `spin registry push` put there is the app as built.
//!
//! This module owns the registry process (its config, storage and log in a
//! temporary directory of its own, no authentication, plain HTTP; killed
//! with its process group when the [`Registry`] is dropped), reading
//! manifests and blobs from it over the Distribution API (`/v2/…`), and
//! [`check_spin_artifact`]: the pushed artifact against `spin.toml` and the
//! `.wasm` files on disk.
//!
//! Spin's OCI layout (Spin 3.x and 4.x alike, as read back from the
//! registry): an OCI image manifest whose config
//! (`application/vnd.oci.image.config.v1+json`) labels the locked app's
//! digest (`com.fermyon.spin.lockedAppDigest`); one layer per distinct
//! component `.wasm` (`application/vnd.wasm.content.layer.v1+wasm`, the
//! file's bytes unchanged when a component has no dependencies to compose);
//! and the locked app (`application/vnd.fermyon.spin.application.v1+config`,
//! JSON), whose components name their `.wasm` by digest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use sha2::Digest as _;

use crate::harness::{free_port, tail, TempDir};
use crate::real_spin::{exchange, kill_group, wait_until_ok, SpinResponse};

/// The registry's program as Debian's `docker-registry` package installs it.
pub const REGISTRY_PROGRAM: &str = "docker-registry";

/// How long the registry may take to answer `GET /v2/`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one request to the registry may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The media type of a component's `.wasm` layer.
pub const WASM_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// The media type of the locked app's layer.
pub const LOCKED_APP_LAYER: &str = "application/vnd.fermyon.spin.application.v1+config";

/// The media type of an OCI image manifest (what the test asks for).
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The registry program: `docker-registry` on `PATH`, else where Debian puts
/// it (`/usr/bin`); `None` when neither exists.
pub fn registry_program() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(REGISTRY_PROGRAM))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let debian = Path::new("/usr/bin").join(REGISTRY_PROGRAM);
        debian.is_file().then_some(debian)
    })
}

/// The registry program for a test that needs it: `None` (with a note) when
/// it is not installed, so the test skips.
///
/// # Panics
/// When it is not installed under CI (`CI` set): `.ci/run` installs the
/// package, and a CI run must not pass without the test.
pub fn require_registry_program() -> Option<PathBuf> {
    let found = registry_program();
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("{REGISTRY_PROGRAM} is required in CI (Debian package docker-registry)");
        }
        eprintln!(
            "note: {REGISTRY_PROGRAM} not installed (Debian package docker-registry): skipped"
        );
    }
    found
}

/// The registry's config: filesystem storage under `root`, plain HTTP on
/// `127.0.0.1:port`, no authentication, deletes allowed, warnings only
/// (the access log stays on).
pub fn registry_config(root: &Path, port: u16) -> String {
    format!(
        "version: 0.1\n\
         log:\n  level: warn\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n",
        serde_json::Value::String(root.to_string_lossy().into_owned())
    )
}

/// A running registry; dropping it kills its process group and removes its
/// storage.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:<port>`: the registry part of a reference.
    pub host: String,
    dir: TempDir,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host)
            .finish()
    }
}

impl Registry {
    /// Starts `program` (see [`require_registry_program`]) on a free
    /// loopback port with a config, storage and log in a temporary
    /// directory, and waits until `GET /v2/` answers 200.
    ///
    /// # Errors
    /// If it exits during startup or does not answer within 30 s; the error
    /// carries the end of its log.
    pub async fn start(program: &Path) -> Result<Registry> {
        let dir = TempDir::new("registry");
        let log = dir.path().join("registry.log");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            let config = dir.path().join("config.yml");
            std::fs::write(&config, registry_config(&dir.path().join("data"), port))
                .context("registry config")?;
            let mut cmd = Command::new(program);
            cmd.arg("serve").arg(&config);
            // Its own process group, killed whole on drop.
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            let out = std::fs::File::create(&log).context("registry.log")?;
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .with_context(|| format!("starting {}", program.display()))?;
            let host = format!("127.0.0.1:{port}");
            match wait_until_serving(&host, &mut child).await {
                Ok(()) => return Ok(Registry { child, host, dir }),
                Err(why) => {
                    kill_group(&mut child);
                    let out = tail(&log, 30);
                    if attempt < 3 && out.to_ascii_lowercase().contains("address already in use") {
                        continue;
                    }
                    bail!("{} {why}:\n{out}", program.display());
                }
            }
        }
    }

    /// The registry process's group (its pid).
    pub fn process_group(&self) -> u32 {
        self.child.id()
    }

    /// The end of the registry's log (access lines included), for failure
    /// messages.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("registry.log"), 30)
    }

    /// `GET path` with an `Accept` header.
    async fn get(&self, path: &str, accept: &str) -> Result<SpinResponse> {
        let (parts, ()) = http::Request::get(path)
            .header("accept", accept)
            .body(())?
            .into_parts();
        let base = format!("http://{}", self.host);
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange(&base, &parts, path, Vec::new())).await
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => bail!("GET {path}: {e:#}\n{}", self.log_tail()),
            Err(_) => bail!("GET {path}: no answer in {} s", REQUEST_TIMEOUT.as_secs()),
        }
    }

    /// The OCI image manifest of `repository:reference` (a tag or digest)
    /// and its digest as the registry reports it (`Docker-Content-Digest`,
    /// checked against the bytes).
    ///
    /// # Errors
    /// Anything but a 200 with a JSON manifest whose bytes hash to the
    /// digest reported.
    pub async fn manifest(&self, repository: &str, reference: &str) -> Result<(String, Value)> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let r = self.get(&path, OCI_MANIFEST).await?;
        ensure!(
            r.parts.status == 200,
            "GET {path}: {} {}",
            r.parts.status,
            String::from_utf8_lossy(&r.body)
        );
        let reported = r
            .parts
            .headers
            .get("docker-content-digest")
            .context("no Docker-Content-Digest")?
            .to_str()?
            .to_string();
        ensure!(
            reported == sha256_digest(&r.body),
            "GET {path}: the registry reports {reported}, the bytes hash to {}",
            sha256_digest(&r.body)
        );
        Ok((reported, serde_json::from_slice(&r.body)?))
    }

    /// The blob `digest` of `repository`, checked against its digest.
    ///
    /// # Errors
    /// Anything but a 200 whose bytes hash to `digest`.
    pub async fn blob(&self, repository: &str, digest: &str) -> Result<Vec<u8>> {
        let path = format!("/v2/{repository}/blobs/{digest}");
        let r = self.get(&path, "*/*").await?;
        ensure!(r.parts.status == 200, "GET {path}: {}", r.parts.status);
        let got = sha256_digest(&r.body);
        ensure!(got == digest, "GET {path}: the bytes hash to {got}");
        Ok(r.body.to_vec())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// Waits until `GET http://host/v2/` answers 200 (the Distribution API's
/// version check; 401 would mean authentication is on), or says why not.
async fn wait_until_serving(host: &str, child: &mut Child) -> std::result::Result<(), String> {
    wait_until_ok(&format!("http://{host}"), "/v2/", child, START_TIMEOUT).await
}

/// `sha256:<hex>` of `bytes`, as OCI digests are written.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let hash = sha2::Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// What [`check_spin_artifact`] found.
#[derive(Debug, Clone)]
pub struct SpinArtifact {
    /// The manifest's digest (what a SpinApp pins as `image: …@sha256:…`).
    pub manifest_digest: String,
    /// Each component id of `spin.toml` and the digest of its `.wasm`.
    pub components: BTreeMap<String, String>,
    /// The `.wasm` layers' total size in bytes.
    pub wasm_bytes: u64,
}

/// Checks that `repository:tag` in `registry` is the app of `manifest` as
/// built: every component of `spin.toml` appears in the locked app with the
/// digest of the `.wasm` file `spin.toml` names (read from disk now), the
/// manifest's `.wasm` layers are exactly those digests (one per distinct
/// file) and their blobs are those bytes, the config labels the locked
/// app's layer, the locked app declares `spin.toml`'s variables, and the
/// manifest's annotations carry the app's name and version. So a push of
/// stale or other files fails here.
///
/// # Errors
/// The first mismatch, naming the component or layer.
pub async fn check_spin_artifact(
    registry: &Registry,
    repository: &str,
    tag: &str,
    manifest: &Path,
) -> Result<SpinArtifact> {
    let app_dir = manifest.parent().context("manifest dir")?;
    let toml: toml::Table = toml::from_str(
        &std::fs::read_to_string(manifest)
            .with_context(|| format!("reading {}", manifest.display()))?,
    )?;
    let mut components = BTreeMap::new();
    for (id, c) in toml
        .get("component")
        .and_then(toml::Value::as_table)
        .context("spin.toml has no components")?
    {
        let source = c
            .get("source")
            .and_then(toml::Value::as_str)
            .with_context(|| format!("component {id}: source is not a local file"))?;
        let file = app_dir.join(source);
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        components.insert(id.clone(), sha256_digest(&bytes));
    }

    let (manifest_digest, m) = registry.manifest(repository, tag).await?;
    let layers = m["layers"].as_array().context("manifest without layers")?;
    let of_type = |t: &str| -> Vec<&Value> {
        layers
            .iter()
            .filter(|l| l["mediaType"].as_str() == Some(t))
            .collect()
    };
    let wasm: Vec<&Value> = of_type(WASM_LAYER);
    let locked: Vec<&Value> = of_type(LOCKED_APP_LAYER);
    ensure!(
        wasm.len() + locked.len() == layers.len(),
        "layers of other types: {m:#}"
    );
    ensure!(locked.len() == 1, "{} locked-app layers", locked.len());

    // One .wasm layer per distinct file, and nothing else.
    let expected: BTreeSet<&String> = components.values().collect();
    let pushed: BTreeSet<&str> = wasm.iter().filter_map(|l| l["digest"].as_str()).collect();
    ensure!(
        pushed.len() == wasm.len(),
        "a .wasm layer twice or without a digest"
    );
    let expected_str: BTreeSet<&str> = expected.iter().map(|s| s.as_str()).collect();
    ensure!(
        pushed == expected_str,
        "the .wasm layers are not the files on disk:\n  pushed   {pushed:?}\n  on disk  {expected_str:?}"
    );
    let mut wasm_bytes = 0;
    for l in &wasm {
        let digest = l["digest"].as_str().unwrap_or_default();
        let blob = registry.blob(repository, digest).await?;
        ensure!(
            Some(blob.len() as u64) == l["size"].as_u64(),
            "layer {digest}: {} bytes, the manifest says {}",
            blob.len(),
            l["size"]
        );
        wasm_bytes += blob.len() as u64;
    }

    // The locked app: each component names its file's digest.
    let locked_digest = locked[0]["digest"].as_str().context("locked app digest")?;
    let lock: Value = serde_json::from_slice(&registry.blob(repository, locked_digest).await?)?;
    let by_id: BTreeMap<&str, &str> = lock["components"]
        .as_array()
        .context("locked app without components")?
        .iter()
        .filter_map(|c| Some((c["id"].as_str()?, c["source"]["digest"].as_str()?)))
        .collect();
    ensure!(
        by_id.len() == components.len(),
        "the locked app has {} components, spin.toml {}",
        by_id.len(),
        components.len()
    );
    for (id, digest) in &components {
        ensure!(
            by_id.get(id.as_str()) == Some(&digest.as_str()),
            "component {id}: the locked app names {:?}, its file on disk is {digest}",
            by_id.get(id.as_str())
        );
    }
    let declared: BTreeSet<&String> = toml
        .get("variables")
        .and_then(toml::Value::as_table)
        .map(|t| t.keys().collect())
        .unwrap_or_default();
    let locked_vars: BTreeSet<&String> = lock["variables"]
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    ensure!(
        declared == locked_vars,
        "variables: spin.toml {declared:?}, locked app {locked_vars:?}"
    );

    // The config points at that locked app.
    let config_digest = m["config"]["digest"].as_str().context("config digest")?;
    let config: Value = serde_json::from_slice(&registry.blob(repository, config_digest).await?)?;
    ensure!(
        config["config"]["Labels"]["com.fermyon.spin.lockedAppDigest"].as_str()
            == Some(locked_digest),
        "the config labels another locked app: {config}"
    );

    let app = toml
        .get("application")
        .context("spin.toml has no [application]")?;
    for (annotation, field) in [
        ("org.opencontainers.image.title", "name"),
        ("org.opencontainers.image.version", "version"),
    ] {
        ensure!(
            m["annotations"][annotation].as_str() == app.get(field).and_then(toml::Value::as_str),
            "annotation {annotation}: {} (spin.toml: {:?})",
            m["annotations"][annotation],
            app.get(field).and_then(toml::Value::as_str)
        );
    }
    Ok(SpinArtifact {
        manifest_digest,
        components,
        wasm_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_written_as_oci_does() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn the_config_binds_loopback_without_auth() {
        let c = registry_config(Path::new("/tmp/a \"b\""), 5123);
        let parsed: serde_norway::Value = serde_norway::from_str(&c).expect("valid YAML");
        assert_eq!(parsed["http"]["addr"].as_str(), Some("127.0.0.1:5123"));
        assert_eq!(
            parsed["storage"]["filesystem"]["rootdirectory"].as_str(),
            Some("/tmp/a \"b\"")
        );
        assert!(parsed.get("auth").is_none());
    }
}
