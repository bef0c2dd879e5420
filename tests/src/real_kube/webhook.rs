//! The HTTPS endpoint on which the API server calls metal-ipam's admission
//! webhook: what the Ingress of the clusterctl artifact (TLS from
//! cert-manager, plain HTTP to the SpinApp) is in a cluster.
//!
//! It listens on a loopback port reserved when the control plane starts
//! (the kube-apiserver's admission configuration names it), terminates TLS
//! with `webhook.crt` (signed by the control plane's CA, which the
//! webhook configuration's `caBundle` carries, as cert-manager's cainjector
//! would put it there) and copies bytes both ways to the Spin app it is
//! routed to. Routed nowhere, it closes each connection after the
//! handshake: the API server sees a webhook that does not answer. A change
//! of route closes the connections open at the time too (the API server
//! keeps its connections to a webhook alive).
//!
//! The API server authenticates to the webhook as the example in
//! `deploy/admission-config.example.yaml` says: an `AdmissionConfiguration`
//! whose kubeconfig has a user named after the endpoint's `host:port` with
//! the app's `api_token` ([`crate::harness::TOKEN`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use super::http::runtime;

/// How long a TLS handshake or the connect to the app may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The running endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    addr: SocketAddr,
    upstream: watch::Sender<Option<SocketAddr>>,
}

impl Endpoint {
    /// Binds a loopback port and serves TLS on it with `dir/webhook.crt`
    /// and `dir/webhook.key`, routed nowhere yet.
    pub(crate) fn start(dir: &Path) -> Result<Endpoint, String> {
        let cert_file = dir.join("webhook.crt");
        let key_file = dir.join("webhook.key");
        let certs = CertificateDer::pem_file_iter(&cert_file)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("reading {}: {e}", cert_file.display()))?;
        let key = PrivateKeyDer::from_pem_file(&key_file)
            .map_err(|e| format!("reading {}: {e}", key_file.display()))?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
            .map_err(|e| format!("the webhook endpoint's TLS config: {e}"))?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("binding the webhook endpoint: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the webhook endpoint's address: {e}"))?;
        let (upstream, route) = watch::channel(None);
        runtime().spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(forward(acceptor.clone(), tcp, route.clone()));
            }
        });
        Ok(Endpoint { addr, upstream })
    }

    /// `127.0.0.1:<port>`: the host of the webhook's `clientConfig.url`.
    pub(crate) fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Routes connections to `app` (a plain-HTTP address), or nowhere;
    /// the connections open now are closed.
    pub(crate) fn route_to(&self, app: Option<SocketAddr>) {
        self.upstream.send_replace(app);
    }

    /// Writes the kube-apiserver's `--admission-control-config-file` and the
    /// kubeconfig it names into `dir`: the webhook plugin sends `Bearer
    /// <token>` to this endpoint (its user is named `host:port`, as the
    /// plugin matches it) and to nothing else. Returns the config's path.
    pub(crate) fn write_admission_config(
        &self,
        dir: &Path,
        token: &str,
    ) -> Result<PathBuf, String> {
        let kubeconfig = dir.join("webhook.kubeconfig");
        let config = dir.join("admission-config.yaml");
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
        };
        write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: \"{}\"\n  user:\n    token: {token}\n",
                self.host()
            ),
        )?;
        write(
            &config,
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\n\
                 kind: AdmissionConfiguration\n\
                 plugins:\n\
                 - name: ValidatingAdmissionWebhook\n  configuration:\n\
                 \x20   apiVersion: apiserver.config.k8s.io/v1\n\
                 \x20   kind: WebhookAdmissionConfiguration\n\
                 \x20   kubeConfigFile: {}\n",
                kubeconfig.display()
            ),
        )?;
        Ok(config)
    }
}

/// One connection: the TLS handshake, then bytes both ways to the route's
/// app until either side closes or the route changes.
async fn forward(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    mut route: watch::Receiver<Option<SocketAddr>>,
) {
    let Ok(Ok(mut tls)) = tokio::time::timeout(STEP_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let Some(to) = *route.borrow_and_update() else {
        return;
    };
    let Ok(Ok(mut app)) = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(to)).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut tls, &mut app) => {}
        _ = route.changed() => {}
    }
}
