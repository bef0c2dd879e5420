//! Child processes, the temporary directory and the certificates.
//!
//! Children are spawned from one dedicated thread that never exits, with
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)` in `pre_exec`: Linux sends that signal
//! when the *thread* that forked the child ends, so a spawner thread of its
//! own makes it fire exactly when the test process dies, however it dies
//! (the statics holding the children are never dropped). On an orderly exit
//! an `atexit` hook also kills them, waits for them and removes etcd's data
//! (etcd preallocates a 64 MB write-ahead log); the logs stay for a look
//! after a failed run, and the next start removes the directories of
//! processes that no longer exist.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;

/// The prefix of our temporary directories, followed by the test process's pid.
const DIR_PREFIX: &str = "metal-ipam-kube-";

/// Creates `<temp>/metal-ipam-kube-<pid>-<n>`, after removing the ones of
/// processes that are gone.
pub(crate) fn make_temp_dir() -> Result<PathBuf, String> {
    let temp = std::env::temp_dir();
    sweep_stale(&temp);
    let pid = std::process::id();
    for n in 0..1000 {
        let dir = temp.join(format!("{DIR_PREFIX}{pid}-{n}"));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "no free {DIR_PREFIX}{pid}-<n> in {}",
        temp.display()
    ))
}

/// Removes `metal-ipam-kube-<pid>-*` directories whose process is gone.
fn sweep_stale(temp: &Path) {
    let Ok(entries) = fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(Ok(pid)) = rest.split('-').next().map(str::parse::<u32>) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

pub(crate) use crate::harness::tail;

/// [`crate::harness::free_port`], its error as text.
pub(crate) fn free_port() -> Result<u16, String> {
    crate::harness::free_port().map_err(|e| format!("{e:#}"))
}

/// Runs a short-lived command (openssl) to completion; `args` is split at
/// whitespace.
pub(crate) fn run(program: &str, args: &str, cwd: &Path) -> Result<(), String> {
    let out = Command::new(program)
        .args(args.split_whitespace())
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {program}: {e} (is it installed and on PATH?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {args}` in {} failed ({}):\n{}",
            cwd.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))
    }
}

/// The CA, the serving certificates of the API server and of the admission
/// webhook's endpoint, and the service-account key pair, made with the
/// `openssl` CLI in `dir`: `ca.crt`/`ca.key`, `apiserver.crt`/`apiserver.key`
/// and `webhook.crt`/`webhook.key` (ECDSA P-256; SANs `IP:127.0.0.1`,
/// `DNS:localhost`), `sa.key`/`sa.pub` (RSA 2048).
pub(crate) fn make_certificates(dir: &Path) -> Result<(), String> {
    // The CA chain is ECDSA P-256 (instant; RSA key generation takes 0.2 s
    // to seconds); the service-account key is RSA, made alongside.
    std::thread::scope(|scope| {
        let sa = scope.spawn(|| {
            run("openssl", "genrsa -out sa.key 2048", dir)?;
            run("openssl", "rsa -in sa.key -pubout -out sa.pub", dir)
        });
        let chain = make_serving_chain(dir);
        let sa = sa
            .join()
            .unwrap_or_else(|_| Err("openssl thread panicked".to_owned()));
        chain.and(sa)
    })
}

fn make_serving_chain(dir: &Path) -> Result<(), String> {
    run(
        "openssl",
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 7 \
         -keyout ca.key -out ca.crt \
         -subj /CN=metal-ipam-tests-ca -addext basicConstraints=critical,CA:TRUE \
         -addext keyUsage=critical,keyCertSign,cRLSign",
        dir,
    )?;
    sign_server_certificate(dir, "apiserver", "kube-apiserver")?;
    sign_server_certificate(dir, "webhook", "metal-ipam-webhook")
}

/// `<name>.key` and `<name>.crt` in `dir`: an ECDSA P-256 serving
/// certificate for `IP:127.0.0.1` and `DNS:localhost`, signed by `ca.crt`.
fn sign_server_certificate(dir: &Path, name: &str, cn: &str) -> Result<(), String> {
    run(
        "openssl",
        &format!(
            "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
             -keyout {name}.key -out {name}.csr -subj /CN={cn}"
        ),
        dir,
    )?;
    fs::write(
        dir.join(format!("{name}.ext")),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
         basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| format!("writing {name}.ext: {e}"))?;
    run(
        "openssl",
        &format!(
            "x509 -req -sha256 -days 7 -in {name}.csr -CA ca.crt -CAkey ca.key \
             -CAcreateserial -extfile {name}.ext -out {name}.crt"
        ),
        dir,
    )
}

// ---------------------------------------------------------------------------
// Spawning
// ---------------------------------------------------------------------------

struct SpawnJob {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// The channel to the spawner thread (started on first use, never ends).
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("real-kube-spawner".to_owned())
            .spawn(move || {
                for job in rx {
                    let mut command = job.command;
                    let _ = job.reply.send(command.spawn());
                }
                // The sender lives in a static, so this is not reached; if
                // it were, this thread must still not exit (its exit would
                // kill the children).
                loop {
                    thread::park();
                }
            })
            .expect("real_kube: starting the spawner thread");
        Mutex::new(tx)
    })
}

/// A running child and where its output goes.
#[derive(Debug)]
pub(crate) struct Proc {
    /// `etcd`, `kube-apiserver`, `kube-controller-manager`.
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `program args…` from the spawner thread, stdout and stderr to
    /// `log`, stdin from /dev/null, dying with the test process.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        cwd: &Path,
        log: PathBuf,
    ) -> Result<Proc, String> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{name}: opening {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{name}: duplicating the log handle: {e}"))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe calls (prctl, getppid).
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent died between fork and prctl: no signal will come.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::other("parent exited before exec"));
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(SpawnJob { command, reply: tx })
            .map_err(|_| format!("{name}: the spawner thread is gone"))?;
        let child = rx
            .recv()
            .map_err(|_| format!("{name}: the spawner thread is gone"))?
            .map_err(|e| format!("{name}: starting {}: {e}", program.display()))?;
        register_for_exit(child.id());
        Ok(Proc { name, child, log })
    }

    /// `Some(description)` if the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown state ({e})")),
        }
    }

    /// A failure message: what went wrong, and the tail of this process's log.
    pub fn failure(&self, what: &str) -> String {
        format!(
            "{what}\n--- last lines of {} ---\n{}",
            self.log.display(),
            tail(&self.log, 40)
        )
    }
}

/// Kills a child that is no longer wanted (a failed start).
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let pid = self.child.id();
        exit_state()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pids
            .retain(|&p| p != pid);
    }
}

// ---------------------------------------------------------------------------
// Cleanup at exit
// ---------------------------------------------------------------------------

struct ExitState {
    pids: Vec<u32>,
    remove: Vec<PathBuf>,
}

fn exit_state() -> &'static Mutex<ExitState> {
    static STATE: OnceLock<Mutex<ExitState>> = OnceLock::new();
    STATE.get_or_init(|| {
        // SAFETY: registering a plain `extern "C"` function.
        unsafe {
            libc::atexit(on_exit);
        }
        Mutex::new(ExitState {
            pids: Vec::new(),
            remove: Vec::new(),
        })
    })
}

fn register_for_exit(pid: u32) {
    exit_state()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pids
        .push(pid);
}

/// Removes `dir` (etcd's data) at exit, after the children are gone.
pub(crate) fn remove_at_exit(dir: PathBuf) {
    exit_state()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove
        .push(dir);
}

extern "C" fn on_exit() {
    // Never panic or block here: try_lock, ignore every error.
    let Ok(state) = exit_state().try_lock() else {
        return;
    };
    for &pid in state.pids.iter().rev() {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            continue;
        };
        // SAFETY: plain syscalls on our own, unreaped children's pids.
        unsafe {
            if libc::kill(pid, libc::SIGKILL) == 0 {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
    for dir in &state.remove {
        let _ = fs::remove_dir_all(dir);
    }
}
