//! The bare-metal cloud seam (`crate::cloud`): a cloud that lacks a
//! capability is refused with an error naming it, before any call; Metal
//! has every capability; and the domain modules name no Metal type (only
//! the Metal implementation, the VRF provisioning and the component wiring
//! may).

use std::cell::RefCell;
use std::fs;
use std::path::Path;

use metal_ipam_core::cloud::{
    AssignedAddress, Capabilities, Capability, Cloud, CloudError, CloudEvent, CloudResult,
    DeviceView, Nic, Operation, Segment,
};
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::network::apply;
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::network::plan::{Desired, Observed};
use metal_ipam_core::network::profile::Profile;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Map, Value};

/// A cloud with one device (bond0 in Layer3 over eth0 and eth1) and the
/// capabilities it is given; it records the calls it gets.
struct Fake {
    caps: Capabilities,
    calls: RefCell<Vec<String>>,
}

impl Fake {
    fn new(caps: Capabilities) -> Self {
        Fake {
            caps,
            calls: RefCell::new(Vec::new()),
        }
    }

    fn note(&self, call: &str) {
        self.calls.borrow_mut().push(call.to_string());
    }
}

fn nic(id: &str, name: &str, bond: bool) -> Nic {
    Nic {
        id: id.into(),
        name: Some(name.into()),
        bond,
        bonded: Some(true),
        mode: bond.then(|| "layer3".into()),
        ..Nic::default()
    }
}

impl Cloud for Fake {
    fn error(&self, e: CloudError) -> metal_ipam_core::Error {
        e.into()
    }

    fn name(&self) -> &'static str {
        "Fake"
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    fn device(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        self.device_nics(id)
    }
    fn device_within(&self, id: &str, _budget_ms: u64) -> CloudResult<Option<DeviceView>> {
        self.device_nics(id)
    }
    fn device_nics(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        self.note("device");
        Ok(Some(DeviceView {
            id: id.into(),
            active: true,
            nics: vec![
                nic("b0", "bond0", true),
                nic("p0", "eth0", false),
                nic("p1", "eth1", false),
            ],
            ..DeviceView::default()
        }))
    }
    fn segment(&self, _id: &str) -> CloudResult<Option<Segment>> {
        Ok(None)
    }
    fn segments(&self, _location: &str) -> CloudResult<Vec<Segment>> {
        Ok(Vec::new())
    }
    fn change_segments(&self, _nic: &str, _attach: bool, _s: &[String]) -> CloudResult<Operation> {
        self.note("change_segments");
        Err(CloudError::Malformed {
            detail: "not in this test".into(),
        })
    }
    fn operation(&self, _nic: &str, _id: &str) -> CloudResult<Option<Operation>> {
        Ok(None)
    }
    fn unfinished_operation(&self, _nic: &str) -> CloudResult<Option<Operation>> {
        Ok(None)
    }
    fn addresses(&self, _device: &str) -> CloudResult<Vec<AssignedAddress>> {
        Ok(Vec::new())
    }
    fn assign_address(
        &self,
        _device: &str,
        _address: &str,
        _labels: Map<String, Value>,
    ) -> CloudResult<AssignedAddress> {
        unreachable!("not in this test")
    }
    fn unassign_address(&self, _id: &str) -> CloudResult<bool> {
        Ok(false)
    }
    fn events_after(
        &self,
        _after: Option<&str>,
        _pages: u32,
    ) -> CloudResult<(Vec<CloudEvent>, bool)> {
        Ok((Vec::new(), true))
    }
}

/// bond0 to Layer2 (no VLANs): one mode change.
fn layer2(fake: &Fake) -> Desired {
    let profile =
        Profile::from_json(&json!({"ports": [{"name": "bond0", "layer2": true}]})).unwrap();
    let observed = Observed::from_device(&fake.device_nics("d").unwrap().unwrap()).unwrap();
    Desired::from_profile(&profile, observed.eth_ports(), &|_| None).unwrap()
}

#[test]
fn a_cloud_without_nic_modes_is_refused_naming_the_capability() {
    let fake = Fake::new(Capabilities::of(&[Capability::BatchAttach]));
    let kv = MemKv::new(Backend::SpinSqlite);
    let env = TestEnv::at(1_000);
    let ctx = Ctx::auto(&kv, &env);
    let desired = layer2(&fake);
    let e = apply::apply(&ctx, &fake, &Direct(&fake), "d", &desired).unwrap_err();
    assert_eq!((e.status(), e.reason()), (422, "CapabilityMissing"), "{e}");
    assert!(e.message().contains("NIC modes") && e.message().contains("Fake"));
    assert!(
        !fake.calls.borrow().iter().any(|c| c != "device"),
        "nothing but reads: {:?}",
        fake.calls.borrow()
    );
}

#[test]
fn capabilities_name_what_is_missing() {
    let none = Capabilities::NONE;
    for c in [
        Capability::NicModes,
        Capability::Bonding,
        Capability::NativeSegment,
        Capability::VrfPools,
        Capability::Gateways,
        Capability::BatchAttach,
        Capability::ChosenAddresses,
    ] {
        assert!(!none.has(c));
        let e = none.require("phoenixNAP", c, "this").unwrap_err();
        assert_eq!(e.reason(), "CapabilityMissing");
        assert!(e.message().contains(c.name()), "{e}");
        assert!(metal_ipam_core::metal::cloud::CAPABILITIES.has(c));
        assert!(!Capabilities::of(&[c]).without(c).has(c));
    }
}

/// The domain modules that must name no Metal type: they talk to
/// `crate::cloud`. (VRF provisioning — `provision::{plan,record,step}`,
/// `capi::vrf` — is Metal's own extension.)
const DOMAIN: &[&str] = &[
    "network",
    "capi/device.rs",
    "capi/network",
    "capi/machine.rs",
    "capi/poll.rs",
    "capi/assign.rs",
    "provision/assign.rs",
    "provision/poll.rs",
];

fn code_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(p: &Path, out: &mut Vec<std::path::PathBuf>) {
    if p.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if p.extension().is_some_and(|x| x == "rs") {
        out.push(p.to_path_buf());
    }
}

#[test]
fn domain_modules_name_no_metal_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for d in DOMAIN {
        let p = src.join(d);
        if p.exists() {
            rust_files(&p, &mut files);
        }
    }
    assert!(files.len() >= 15, "{files:?}");
    let bad: Vec<String> = files
        .iter()
        .filter(|f| {
            let code = code_of(f);
            // `crate::metal::…`, `crate::{metal::…}`, `super::super::metal`.
            code.contains("metal::") || code.contains("crate::metal")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(bad.is_empty(), "these name crate::metal: {bad:?}");
}
