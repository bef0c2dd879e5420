//! Which cloud device (an Equinix Metal device or a phoenixNAP server) an
//! object is on: a provider ID read as a (cloud, id) pair
//! ([`cloud_device_of`]; [`device_of`] for Metal's alone), a Machine's
//! device ([`device_in`], [`cloud_device_in`]) and a claim's
//! ([`resolve_device`]). The assignment step ([`super::assign`]), the
//! machine network step ([`super::network`]) and the Metal poll
//! ([`super::poll`]) use it; it imports none of them.
//!
//! # Provider IDs
//! | Form | Cloud | Written by |
//! |---|---|---|
//! | `equinixmetal://<uuid>`, a bare uuid | Metal | CAPP, Metal's cloud controller |
//! | `bmc://servers/<id>` | phoenixNAP | phoenixNAP's Cluster API provider (`BMCMachine`) |
//! | `phoenixnap://<id>` | phoenixNAP | phoenixNAP's cloud controller (a Node's `spec.providerID`) |
//! | a bare `<id>` | phoenixNAP | what phoenixNAP's cloud controller also reads |
//!
//! A phoenixNAP server id is 24 lowercase hex digits (the specs' examples,
//! what the API returns); anything else under its prefixes is refused. A
//! bare id is read by its form: 24 lowercase hex digits are a phoenixNAP
//! server (a Metal device id is a uuid, 36 characters with dashes), any
//! other run of hex digits and dashes is Metal's, as before.
//!
//! # A claim's device
//! The annotation [`DEVICE_ANNOTATION`] on the claim (any form above) wins;
//! otherwise the claim's owners are followed: a CAPI `Machine`, a CAPP
//! `PacketMachine` or a phoenixNAP `BMCMachine` whose `spec.providerID` is
//! one of the forms above (the owner's uid must match the reference, so a
//! re-created machine of the same name is not mistaken for it). The device
//! found carries its cloud ([`DeviceRef::Known`]); a step working on one
//! cloud takes it through [`DeviceRef::for_cloud`], which refuses a device
//! of the other cloud (422 `InvalidDevice` naming both).

use super::objects::MachineObject;
use crate::cloud::CloudKind;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::claim::ClaimObject;
use crate::kube::{self, Kube, Resource};
use crate::ports::http::HttpClient;

/// Annotation on a claim naming its device (any form of
/// [`cloud_device_of`]: `equinixmetal://<uuid>`, `bmc://servers/<id>`,
/// `phoenixnap://<id>` or a bare id), for claims whose owners do not lead
/// to one.
pub const DEVICE_ANNOTATION: &str = "ipam.metal-ipam.dev/device";

/// The scheme of Metal's provider IDs.
const METAL_SCHEME: &str = "equinixmetal://";
/// The prefix phoenixNAP's Cluster API provider writes into
/// `BMCMachine.spec.providerID` (and so CAPI into `Machine.spec.providerID`).
const BMC_PREFIX: &str = "bmc://servers/";
/// The scheme of phoenixNAP's cloud controller (a Node's `spec.providerID`).
const PHOENIXNAP_SCHEME: &str = "phoenixnap://";

/// The forms a provider ID or the annotation may take, for messages.
const FORMS: &str = "equinixmetal://<uuid>, bmc://servers/<id> or phoenixnap://<id>";

/// Whether `id` looks like a Metal device id: hex digits and dashes, at
/// most 64 (a uuid, as Metal writes it).
fn metal_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Whether `id` is a phoenixNAP server id: 24 lowercase hex digits.
fn phoenixnap_id(id: &str) -> bool {
    id.len() == 24 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The Metal device id a provider ID names: `equinixmetal://<uuid>` or a
/// bare uuid (what CAPP and the cloud controller write), for the callers
/// that work on Metal only (any bare run of hex digits and dashes, as
/// before phoenixNAP). phoenixNAP's prefixed forms are not Metal's: see
/// [`cloud_device_of`].
///
/// ```
/// use metal_ipam_core::capi::device::device_of;
/// assert_eq!(device_of("equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"),
///     Some("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"));
/// assert_eq!(device_of("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"), Some("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"));
/// assert_eq!(device_of("aws:///us-east-1a/i-0abc"), None);
/// assert_eq!(device_of("equinixmetal://"), None);
/// assert_eq!(device_of("equinixmetal://../x"), None);
/// assert_eq!(device_of("bmc://servers/60473a6115e34466c9f8f083"), None);
/// assert_eq!(device_of("phoenixnap://60473a6115e34466c9f8f083"), None);
/// ```
pub fn device_of(provider_id: &str) -> Option<&str> {
    let id = provider_id
        .strip_prefix(METAL_SCHEME)
        .unwrap_or(provider_id);
    metal_id(id).then_some(id)
}

/// The cloud and device id a provider ID names: phoenixNAP's
/// `bmc://servers/<id>` (its Cluster API provider) and `phoenixnap://<id>`
/// (its cloud controller) with `<id>` 24 lowercase hex digits, and a bare
/// id of that form; Metal's forms as [`device_of`] reads them otherwise.
/// Anything else is `None`: no other scheme, no path characters.
///
/// ```
/// use metal_ipam_core::capi::device::cloud_device_of;
/// use metal_ipam_core::cloud::CloudKind;
/// let metal = "9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60";
/// assert_eq!(cloud_device_of("equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"),
///     Some((CloudKind::Metal, metal)));
/// assert_eq!(cloud_device_of(metal), Some((CloudKind::Metal, metal)));
/// let server = "60473a6115e34466c9f8f083";
/// assert_eq!(cloud_device_of("bmc://servers/60473a6115e34466c9f8f083"),
///     Some((CloudKind::Phoenixnap, server)));
/// assert_eq!(cloud_device_of("phoenixnap://60473a6115e34466c9f8f083"),
///     Some((CloudKind::Phoenixnap, server)));
/// // A bare id by its form: 24 lowercase hex digits are a server.
/// assert_eq!(cloud_device_of(server), Some((CloudKind::Phoenixnap, server)));
/// assert_eq!(cloud_device_of("equinixmetal://60473a6115e34466c9f8f083"),
///     Some((CloudKind::Metal, server)));
/// // Refused: another cloud, an empty id, path characters, a wrong length
/// // or case, a uuid under phoenixNAP's schemes.
/// assert_eq!(cloud_device_of("aws:///us-east-1a/i-0abc"), None);
/// assert_eq!(cloud_device_of("bmc://servers/"), None);
/// assert_eq!(cloud_device_of("bmc://servers/../60473a6115e34466c9f8f083"), None);
/// assert_eq!(cloud_device_of("bmc://servers/60473a6115e34466c9f8f083/"), None);
/// assert_eq!(cloud_device_of("bmc://60473a6115e34466c9f8f083"), None);
/// assert_eq!(cloud_device_of("phoenixnap://60473a6115e34466c9f8f08"), None);
/// assert_eq!(cloud_device_of("phoenixnap://60473A6115E34466C9F8F083"), None);
/// assert_eq!(cloud_device_of("phoenixnap://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"), None);
/// ```
pub fn cloud_device_of(provider_id: &str) -> Option<(CloudKind, &str)> {
    for prefix in [BMC_PREFIX, PHOENIXNAP_SCHEME] {
        if let Some(id) = provider_id.strip_prefix(prefix) {
            return phoenixnap_id(id).then_some((CloudKind::Phoenixnap, id));
        }
    }
    if phoenixnap_id(provider_id) {
        return Some((CloudKind::Phoenixnap, provider_id));
    }
    device_of(provider_id).map(|id| (CloudKind::Metal, id))
}

/// The provider ID of the Machine, else of its infrastructure machine.
pub fn provider_of<'a>(
    machine: &'a MachineObject,
    infra: Option<&'a MachineObject>,
) -> Option<&'a str> {
    machine
        .provider_id
        .as_deref()
        .or_else(|| infra.and_then(|i| i.provider_id.as_deref()))
}

/// The cloud and device the provider ID of the Machine (else of its
/// infrastructure machine) names, if it has one.
///
/// # Errors
/// 422 for a provider ID that is none of the forms of [`cloud_device_of`].
pub fn cloud_device_in(
    machine: &MachineObject,
    infra: Option<&MachineObject>,
) -> Result<Option<(CloudKind, String)>> {
    match provider_of(machine, infra) {
        None => Ok(None),
        Some(p) => match cloud_device_of(p) {
            Some((cloud, d)) => Ok(Some((cloud, d.to_string()))),
            None => Err(Error::invalid(
                "spec.providerID",
                format!("{p:?} is not {FORMS}"),
            )),
        },
    }
}

/// The device the provider ID of the Machine (else of its infrastructure
/// machine) names, if it has one: a Metal device or a phoenixNAP server
/// (which one is in the id's form: [`device_cloud`]).
///
/// # Errors
/// 422 for a provider ID of no known form.
pub fn device_in(machine: &MachineObject, infra: Option<&MachineObject>) -> Result<Option<String>> {
    Ok(cloud_device_in(machine, infra)?.map(|(_, d)| d))
}

/// The cloud of a device id as [`cloud_device_of`] reads it: a phoenixNAP
/// server's (24 hex digits) or else Metal's.
///
/// ```
/// use metal_ipam_core::capi::device::device_cloud;
/// use metal_ipam_core::cloud::CloudKind;
/// assert_eq!(device_cloud("60473a6115e34466c9f8f083"), CloudKind::Phoenixnap);
/// assert_eq!(device_cloud("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"), CloudKind::Metal);
/// ```
pub fn device_cloud(id: &str) -> CloudKind {
    match cloud_device_of(id) {
        Some((CloudKind::Phoenixnap, _)) => CloudKind::Phoenixnap,
        _ => CloudKind::Metal,
    }
}

/// Where a claim's device comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// The device's cloud and id.
    Known(CloudKind, String),
    /// No annotation, and no owner with a provider ID yet.
    Unknown,
    /// The annotation or an owner's provider ID is none of the forms of
    /// [`cloud_device_of`] (why).
    Invalid(String),
}

/// The `reason` of the error [`DeviceRef::for_cloud`] returns.
pub const INVALID_DEVICE: &str = "InvalidDevice";

impl DeviceRef {
    /// The device's id when the step working on `cloud` may use it: `None`
    /// while it is unknown.
    ///
    /// ```
    /// use metal_ipam_core::capi::device::DeviceRef;
    /// use metal_ipam_core::cloud::CloudKind;
    /// let server = DeviceRef::Known(CloudKind::Phoenixnap, "60473a6115e34466c9f8f083".into());
    /// assert_eq!(server.for_cloud(CloudKind::Phoenixnap).unwrap(), Some("60473a6115e34466c9f8f083"));
    /// let e = server.for_cloud(CloudKind::Metal).unwrap_err();
    /// assert_eq!((e.status(), e.reason()), (422, "InvalidDevice"));
    /// assert_eq!(e.message(), "the pool is on Metal, but the claim's device \
    ///     60473a6115e34466c9f8f083 is a phoenixNAP server");
    /// assert_eq!(DeviceRef::Unknown.for_cloud(CloudKind::Metal).unwrap(), None);
    /// let e = DeviceRef::Invalid("why".into()).for_cloud(CloudKind::Metal).unwrap_err();
    /// assert_eq!((e.reason(), e.message()), ("InvalidDevice", "why"));
    /// ```
    ///
    /// # Errors
    /// 422 `InvalidDevice`: the device is on the other cloud (the message
    /// names both), or [`DeviceRef::Invalid`] (its message).
    pub fn for_cloud(&self, cloud: CloudKind) -> Result<Option<&str>> {
        match self {
            DeviceRef::Known(c, d) if *c == cloud => Ok(Some(d)),
            DeviceRef::Known(c, d) => Err(Error::new(
                ErrorKind::Invalid,
                INVALID_DEVICE,
                format!(
                    "the pool is on {}, but the claim's device {d} is {}",
                    cloud.name(),
                    match c {
                        CloudKind::Metal => "a Metal device",
                        CloudKind::Phoenixnap => "a phoenixNAP server",
                    }
                ),
            )),
            DeviceRef::Unknown => Ok(None),
            DeviceRef::Invalid(msg) => {
                Err(Error::new(ErrorKind::Invalid, INVALID_DEVICE, msg.clone()))
            }
        }
    }
}

fn machine_resource(api_version: &str, kind: &str) -> Option<&'static Resource> {
    let group = api_version.split('/').next().unwrap_or_default();
    match (group, kind) {
        ("cluster.x-k8s.io", "Machine") => Some(&kube::MACHINES),
        ("infrastructure.cluster.x-k8s.io", "PacketMachine") => Some(&kube::PACKET_MACHINES),
        ("infrastructure.cluster.x-k8s.io", "BMCMachine") => Some(&kube::BMC_MACHINES),
        _ => None,
    }
}

/// `p` read as a [`DeviceRef`]; `what` says where it was read, for the
/// message when it is none of the forms.
fn device_ref(p: &str, what: impl FnOnce() -> String) -> DeviceRef {
    match cloud_device_of(p) {
        Some((cloud, d)) => DeviceRef::Known(cloud, d.to_string()),
        None => DeviceRef::Invalid(format!("{} is {p:?}, not {FORMS}", what())),
    }
}

/// The claim's device (see the module docs): one GET per machine owner
/// followed, none when the annotation names it.
///
/// # Errors
/// API server errors.
pub fn resolve_device<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    claim: &ClaimObject,
) -> Result<DeviceRef> {
    let m = &claim.metadata;
    if let Some(a) = m.annotation(DEVICE_ANNOTATION) {
        return Ok(device_ref(a, || format!("annotation {DEVICE_ANNOTATION}")));
    }
    for owner in &m.owner_references {
        let Some(r) = machine_resource(&owner.api_version, &owner.kind) else {
            continue;
        };
        // A name from an object goes into an API path only once it is a
        // valid Kubernetes name.
        if let Err(e) = crate::kube::names::check_subdomain(&owner.name) {
            return Ok(DeviceRef::Invalid(format!(
                "owner {} {:?} is not a valid name: {e}",
                owner.kind, owner.name
            )));
        }
        let machine: Option<MachineObject> = kube.get_as(r, m.namespace.as_deref(), &owner.name)?;
        let Some(machine) = machine.filter(|o| o.metadata.uid.as_deref() == Some(&owner.uid))
        else {
            continue;
        };
        let Some(p) = machine.provider_id.as_deref() else {
            continue;
        };
        return Ok(device_ref(p, || {
            format!("{} {} spec.providerID", owner.kind, owner.name)
        }));
    }
    Ok(DeviceRef::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::object::Object;
    use serde_json::{json, Value};

    const UUID: &str = "9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60";
    /// A server id from the BMC spec's examples.
    const SERVER: &str = "60473a6115e34466c9f8f083";

    #[test]
    fn every_accepted_form_names_its_cloud_and_id() {
        for (p, cloud, id) in [
            (
                "equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60",
                CloudKind::Metal,
                UUID,
            ),
            (UUID, CloudKind::Metal, UUID),
            ("equinixmetal://d-1", CloudKind::Metal, "d-1"),
            (
                "bmc://servers/60473a6115e34466c9f8f083",
                CloudKind::Phoenixnap,
                SERVER,
            ),
            (
                "phoenixnap://60473a6115e34466c9f8f083",
                CloudKind::Phoenixnap,
                SERVER,
            ),
            // A bare id by its form.
            (SERVER, CloudKind::Phoenixnap, SERVER),
            (
                "equinixmetal://60473a6115e34466c9f8f083",
                CloudKind::Metal,
                SERVER,
            ),
            ("d-1", CloudKind::Metal, "d-1"),
        ] {
            assert_eq!(cloud_device_of(p), Some((cloud, id)), "{p}");
        }
    }

    #[test]
    fn every_other_form_is_refused() {
        for p in [
            "",
            "aws:///us-east-1a/i-0abc",
            "equinixmetal://",
            "equinixmetal://../x",
            "equinixmetal://9f1c2a4e/7b3d",
            "bmc://servers/",
            "bmc://servers",
            "bmc://60473a6115e34466c9f8f083",
            "bmc://servers/60473a6115e34466c9f8f083/",
            "bmc://servers/../60473a6115e34466c9f8f083",
            "bmc://servers/60473a6115e34466c9f8f083?x=1",
            "bmc://servers/60473a6115e34466c9f8f08",
            "bmc://servers/60473a6115e34466c9f8f0830",
            "bmc://servers/60473a6115e34466c9f8f08g",
            "bmc://servers/60473A6115E34466C9F8F083",
            "bmc://servers/9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60",
            "phoenixnap://",
            "phoenixnap://60473a6115e34466c9f8f083/",
            "phoenixnap://servers/60473a6115e34466c9f8f083",
            "phoenixnap:///60473a6115e34466c9f8f083",
            "phoenixnap://60473a6115e34466c9f8f083 ",
            "PHOENIXNAP://60473a6115e34466c9f8f083",
            "phoenixnap://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60",
            "equinixmetal://60473a6115e34466c9f8f083/servers",
            "equinixmetal://bmc://servers/60473a6115e34466c9f8f083",
        ] {
            assert_eq!(cloud_device_of(p), None, "{p:?}");
        }
    }

    /// `device_of` reads Metal's forms as before (a bare 24-hex id too),
    /// and nothing of phoenixNAP's prefixed forms.
    #[test]
    fn device_of_is_metal_only() {
        for p in [
            "equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60",
            UUID,
            SERVER,
        ] {
            assert_eq!(device_of(p), cloud_device_of(p).map(|(_, d)| d), "{p}");
        }
        for p in [
            "bmc://servers/60473a6115e34466c9f8f083",
            "phoenixnap://60473a6115e34466c9f8f083",
        ] {
            assert_eq!(device_of(p), None, "{p}");
        }
    }

    fn machine(provider_id: Option<&str>) -> MachineObject {
        MachineObject {
            provider_id: provider_id.map(str::to_string),
            ..MachineObject::default()
        }
    }

    #[test]
    fn a_machines_device_is_its_own_provider_id_else_its_infrastructure_machines() {
        let server = machine(Some("bmc://servers/60473a6115e34466c9f8f083"));
        let device = machine(Some("equinixmetal://d-1"));
        let none = machine(None);
        assert_eq!(
            cloud_device_in(&none, Some(&server)).unwrap(),
            Some((CloudKind::Phoenixnap, SERVER.to_string()))
        );
        assert_eq!(
            cloud_device_in(&device, Some(&server)).unwrap(),
            Some((CloudKind::Metal, "d-1".to_string()))
        );
        assert_eq!(cloud_device_in(&none, None).unwrap(), None);
        assert_eq!(device_in(&none, Some(&device)).unwrap(), Some("d-1".into()));
        assert_eq!(device_in(&none, None).unwrap(), None);
        let e = cloud_device_in(&machine(Some("aws:///i-0abc")), None).unwrap_err();
        assert_eq!((e.status(), e.field()), (422, Some("spec.providerID")));
        assert!(e.message().contains("bmc://servers/<id>"), "{e}");
    }

    /// The Metal-only callers of `device_in` refuse a phoenixNAP server by
    /// name, and anything else as before.
    #[test]
    fn device_in_reads_both_clouds_and_refuses_other_forms() {
        let server = device_in(
            &machine(Some("phoenixnap://60473a6115e34466c9f8f083")),
            None,
        )
        .unwrap();
        assert_eq!(server.as_deref(), Some("60473a6115e34466c9f8f083"));
        assert_eq!(
            device_cloud(server.as_deref().unwrap()),
            CloudKind::Phoenixnap
        );
        let e = device_in(&machine(Some("aws:///i-0abc")), None).unwrap_err();
        assert_eq!((e.status(), e.field()), (422, Some("spec.providerID")));
        assert!(
            e.message().starts_with("\"aws:///i-0abc\" is not"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn for_cloud_takes_a_device_of_its_cloud_and_refuses_the_others() {
        let metal = DeviceRef::Known(CloudKind::Metal, UUID.into());
        let server = DeviceRef::Known(CloudKind::Phoenixnap, SERVER.into());
        assert_eq!(metal.for_cloud(CloudKind::Metal).unwrap(), Some(UUID));
        assert_eq!(
            server.for_cloud(CloudKind::Phoenixnap).unwrap(),
            Some(SERVER)
        );
        let e = metal.for_cloud(CloudKind::Phoenixnap).unwrap_err();
        assert_eq!((e.status(), e.reason()), (422, INVALID_DEVICE));
        assert_eq!(
            e.message(),
            format!("the pool is on phoenixNAP, but the claim's device {UUID} is a Metal device")
        );
        let e = server.for_cloud(CloudKind::Metal).unwrap_err();
        assert_eq!((e.status(), e.reason()), (422, INVALID_DEVICE));
        assert!(e.message().contains("the pool is on Metal"), "{e}");
        assert!(e.message().contains(SERVER), "{e}");
        for cloud in [CloudKind::Metal, CloudKind::Phoenixnap] {
            assert_eq!(DeviceRef::Unknown.for_cloud(cloud).unwrap(), None);
            let e = DeviceRef::Invalid("why".into())
                .for_cloud(cloud)
                .unwrap_err();
            assert_eq!(
                (e.status(), e.reason(), e.message()),
                (422, INVALID_DEVICE, "why")
            );
        }
    }

    #[cfg(feature = "testing")]
    mod resolve {
        use super::*;
        use crate::kube::KubeConfig;
        use crate::testing::{Reply, ScriptedHttp};

        const MACHINES: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines";
        const PACKET_MACHINES: &str =
            "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/ns/packetmachines";
        const BMC_MACHINES: &str =
            "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/ns/bmcmachines";

        fn claim(annotations: Value, owners: Value) -> ClaimObject {
            ClaimObject::from_json(&json!({
                "metadata": {"name": "c", "namespace": "ns", "uid": "c-1",
                             "annotations": annotations, "ownerReferences": owners}}))
        }

        fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid})
        }

        fn object(kind: &str, name: &str, uid: &str, provider_id: &str) -> Value {
            json!({"kind": kind, "metadata": {"name": name, "namespace": "ns", "uid": uid},
                   "spec": {"providerID": provider_id}})
        }

        fn resolve(http: &ScriptedHttp, claim: &ClaimObject) -> DeviceRef {
            let cfg = KubeConfig {
                base_url: "https://kube.test".into(),
                token: "t".into(),
            };
            let out = resolve_device(&Kube::new(http, &cfg), claim).unwrap();
            http.assert_done();
            out
        }

        /// The annotation wins, in any accepted form, with no request.
        #[test]
        fn the_annotation_names_either_cloud_without_a_request() {
            let owners = json!([owner("cluster.x-k8s.io/v1beta2", "Machine", "m", "m-1")]);
            for (a, want) in [
                (
                    "bmc://servers/60473a6115e34466c9f8f083",
                    DeviceRef::Known(CloudKind::Phoenixnap, SERVER.into()),
                ),
                (
                    "phoenixnap://60473a6115e34466c9f8f083",
                    DeviceRef::Known(CloudKind::Phoenixnap, SERVER.into()),
                ),
                (
                    "equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60",
                    DeviceRef::Known(CloudKind::Metal, UUID.into()),
                ),
                (UUID, DeviceRef::Known(CloudKind::Metal, UUID.into())),
                (
                    "phoenixnap://../secrets",
                    DeviceRef::Invalid(format!(
                        "annotation {DEVICE_ANNOTATION} is \"phoenixnap://../secrets\", not {FORMS}"
                    )),
                ),
            ] {
                let c = claim(json!({DEVICE_ANNOTATION: a}), owners.clone());
                assert_eq!(resolve(&ScriptedHttp::new(vec![]), &c), want, "{a}");
            }
        }

        /// A Machine whose provider ID is what phoenixNAP's Cluster API
        /// provider writes: its server, after one GET.
        #[test]
        fn a_machine_owner_names_a_phoenixnap_server() {
            let c = claim(
                json!({}),
                json!([owner("cluster.x-k8s.io/v1beta2", "Machine", "m", "m-1")]),
            );
            let m = object(
                "Machine",
                "m",
                "m-1",
                "bmc://servers/60473a6115e34466c9f8f083",
            );
            let http = ScriptedHttp::new(vec![(&format!("GET {MACHINES}/m"), Reply::json(200, m))]);
            assert_eq!(
                resolve(&http, &c),
                DeviceRef::Known(CloudKind::Phoenixnap, SERVER.into())
            );
        }

        /// A claim owned by the `BMCMachine` itself: its server, read from
        /// the `BMCMachine`'s provider ID.
        #[test]
        fn a_bmc_machine_owner_names_its_server() {
            let c = claim(
                json!({}),
                json!([owner(
                    "infrastructure.cluster.x-k8s.io/v1beta1",
                    "BMCMachine",
                    "bm",
                    "bm-1"
                )]),
            );
            let bm = object(
                "BMCMachine",
                "bm",
                "bm-1",
                "bmc://servers/60473a6115e34466c9f8f083",
            );
            let http = ScriptedHttp::new(vec![(
                &format!("GET {BMC_MACHINES}/bm"),
                Reply::json(200, bm),
            )]);
            assert_eq!(
                resolve(&http, &c),
                DeviceRef::Known(CloudKind::Phoenixnap, SERVER.into())
            );
        }

        /// Metal's owners resolve as before.
        #[test]
        fn a_packet_machine_owner_names_a_metal_device() {
            let c = claim(
                json!({}),
                json!([owner(
                    "infrastructure.cluster.x-k8s.io/v1beta1",
                    "PacketMachine",
                    "pm",
                    "pm-1"
                )]),
            );
            let pm = object("PacketMachine", "pm", "pm-1", "equinixmetal://d-1");
            let http = ScriptedHttp::new(vec![(
                &format!("GET {PACKET_MACHINES}/pm"),
                Reply::json(200, pm),
            )]);
            assert_eq!(
                resolve(&http, &c),
                DeviceRef::Known(CloudKind::Metal, "d-1".into())
            );
        }

        /// An owner of another uid (re-created under the same name) is
        /// not the claim's: the device stays unknown.
        #[test]
        fn an_owner_of_another_uid_is_not_followed() {
            let c = claim(
                json!({}),
                json!([owner("cluster.x-k8s.io/v1beta2", "Machine", "m", "m-1")]),
            );
            let m = object(
                "Machine",
                "m",
                "m-2",
                "phoenixnap://60473a6115e34466c9f8f083",
            );
            let http = ScriptedHttp::new(vec![(&format!("GET {MACHINES}/m"), Reply::json(200, m))]);
            assert_eq!(resolve(&http, &c), DeviceRef::Unknown);
        }

        /// A provider ID under phoenixNAP's scheme with an id that is not
        /// one: invalid, naming the owner and the forms.
        #[test]
        fn a_malformed_phoenixnap_provider_id_is_invalid() {
            let c = claim(
                json!({}),
                json!([owner("cluster.x-k8s.io/v1beta2", "Machine", "m", "m-1")]),
            );
            let m = object("Machine", "m", "m-1", "bmc://servers/not-a-server");
            let http = ScriptedHttp::new(vec![(&format!("GET {MACHINES}/m"), Reply::json(200, m))]);
            assert_eq!(
                resolve(&http, &c),
                DeviceRef::Invalid(format!(
                    "Machine m spec.providerID is \"bmc://servers/not-a-server\", not {FORMS}"
                ))
            );
        }
    }
}
