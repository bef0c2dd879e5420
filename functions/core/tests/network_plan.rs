//! The port planner against a model of Metal's port rules: from every
//! valid state of a bond (each of the five modes, with every small set of
//! VLANs and native VLANs) to every valid desired state, on 2- and 4-port
//! devices, the plan is accepted call by call by the model (which refuses
//! what Metal refuses: bonding or converting to layer3 with VLANs on,
//! disbonding a Layer3 bond, converting a hybrid bond to layer2, a native
//! VLAN on fewer than two VLANs or on a Layer3 bond, the no-op calls Metal
//! answers 422, …), ends in exactly the desired state, and planning again
//! from there gives nothing. Also: profile rules name the field, the
//! derived modes, dry-run JSON, frozen devices.

use std::collections::{BTreeMap, BTreeSet};

use metal_ipam_core::network::plan::{
    plan, Action, Desired, DesiredPort, Observed, ObservedPort, PortStep,
};
use metal_ipam_core::network::profile::{bonds, Mode, Profile, VlanRef};
use serde_json::json;

/// A port in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
struct P {
    bonded: bool,
    layer2: bool,
    vlans: BTreeSet<String>,
    native: Option<String>,
}

/// Metal's port rules, as the notes (§4) describe them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Model {
    eth: usize,
    ports: BTreeMap<String, P>,
}

impl Model {
    fn group_of(&self, name: &str) -> (&'static str, Vec<&'static str>) {
        bonds(self.eth)
            .into_iter()
            .find(|(b, m)| *b == name || m.contains(&name))
            .expect("a known port")
    }

    fn mode(&self, bond: &str) -> Mode {
        let (_, members) = self.group_of(bond);
        let b = &self.ports[bond];
        if b.layer2 {
            if b.bonded {
                Mode::Layer2Bonded
            } else {
                Mode::Layer2Individual
            }
        } else if members.iter().any(|m| !self.ports[*m].bonded) {
            Mode::Hybrid
        } else if !b.vlans.is_empty() {
            Mode::HybridBonded
        } else {
            Mode::Layer3
        }
    }

    fn apply(&mut self, s: &PortStep) -> Result<(), String> {
        let name = s.port.as_str();
        let (bond, members) = self.group_of(name);
        let is_bond = name == bond;
        let group_vlans = |m: &Model| {
            std::iter::once(bond)
                .chain(members.iter().copied())
                .any(|p| !m.ports[p].vlans.is_empty())
        };
        let layer2 = self.ports[bond].layer2;
        match &s.action {
            Action::RemoveNative => {
                let p = self.ports.get_mut(name).unwrap();
                if p.native.take().is_none() {
                    return Err(format!("{name}: no native VLAN to remove"));
                }
            }
            Action::Unassign(vs) => {
                let p = self.ports.get_mut(name).unwrap();
                if vs.is_empty() {
                    return Err("an empty batch".into());
                }
                for v in vs {
                    if p.native.as_ref() == Some(v) {
                        return Err(format!("{name}: {v} is the native VLAN"));
                    }
                    if !p.vlans.remove(v) {
                        return Err(format!("{name}: Virtual network {v} not assigned"));
                    }
                }
            }
            Action::Assign(vs) => {
                if vs.is_empty() {
                    return Err("an empty batch".into());
                }
                let carries = if is_bond {
                    self.ports[name].bonded && self.mode(bond) != Mode::Hybrid
                } else {
                    !self.ports[name].bonded
                };
                if !carries {
                    return Err(format!(
                        "{name} cannot carry VLANs in {:?}",
                        self.mode(bond)
                    ));
                }
                let p = self.ports.get_mut(name).unwrap();
                for v in vs {
                    if !p.vlans.insert(v.clone()) {
                        return Err(format!("{name}: Virtual network {v} already assigned"));
                    }
                }
            }
            Action::SetNative(v) => {
                if is_bond && !layer2 {
                    return Err(format!("{name}: no native VLAN on a Layer3 bond"));
                }
                let p = self.ports.get_mut(name).unwrap();
                if !p.vlans.contains(v) || p.vlans.len() < 2 {
                    return Err(format!("{name}: native {v} needs it assigned and 2+ VLANs"));
                }
                p.native = Some(v.clone());
            }
            Action::Disbond { bulk } => {
                if is_bond != *bulk {
                    return Err("bulk is for bond ports".into());
                }
                if is_bond {
                    if !layer2 {
                        return Err(format!("{name}: a Layer3 bond cannot be disbonded"));
                    }
                    if !self.ports[name].bonded {
                        return Err(format!("{name} is already unbonded"));
                    }
                    if group_vlans(self) {
                        return Err(format!("{name}: VLANs assigned"));
                    }
                    for p in std::iter::once(bond).chain(members.iter().copied()) {
                        self.ports.get_mut(p).unwrap().bonded = false;
                    }
                } else {
                    if layer2 || name != members[1] {
                        return Err(format!(
                            "{name}: only the second member of a Layer3 bond leaves it"
                        ));
                    }
                    if !self.ports[name].bonded {
                        return Err(format!("{name} is already unbonded"));
                    }
                    if !self.ports[bond].vlans.is_empty() {
                        return Err(format!("{bond} carries VLANs"));
                    }
                    self.ports.get_mut(name).unwrap().bonded = false;
                }
            }
            Action::Bond { bulk } => {
                if is_bond != *bulk {
                    return Err("bulk is for bond ports".into());
                }
                let targets: Vec<&str> = if is_bond {
                    std::iter::once(bond)
                        .chain(members.iter().copied())
                        .collect()
                } else {
                    vec![name]
                };
                if targets.iter().all(|p| self.ports[*p].bonded) {
                    return Err(format!("{name} is already bonded"));
                }
                if targets.iter().any(|p| !self.ports[*p].vlans.is_empty()) {
                    return Err(format!("{name}: VLANs assigned (unassign before bonding)"));
                }
                for p in targets {
                    self.ports.get_mut(p).unwrap().bonded = true;
                }
            }
            Action::ConvertLayer2 => {
                if !is_bond {
                    return Err("layer2 on bond ports only".into());
                }
                if layer2 {
                    return Err(format!("{name} is already configured for Layer 2"));
                }
                if self.mode(bond) == Mode::Hybrid {
                    return Err(format!("{name} is already configured for Layer 2 (hybrid)"));
                }
                self.ports.get_mut(name).unwrap().layer2 = true;
            }
            Action::ConvertLayer3 => {
                if !is_bond || !layer2 {
                    return Err(format!(
                        "{name}: The port already has a public IPv4 assignment"
                    ));
                }
                if !self.ports[name].bonded {
                    return Err(format!("{name}: bond before converting to layer3"));
                }
                if group_vlans(self) {
                    return Err(format!("{name}: VLANs must be unassigned first"));
                }
                self.ports.get_mut(name).unwrap().layer2 = false;
            }
        }
        Ok(())
    }

    fn observed(&self) -> Observed {
        Observed {
            frozen: false,
            ports: self
                .ports
                .iter()
                .map(|(n, p)| ObservedPort {
                    id: format!("id-{n}"),
                    name: n.clone(),
                    bonded: p.bonded,
                    mode: n.starts_with("bond").then(|| self.mode(n)),
                    vlans: p.vlans.clone(),
                    native: p.native.clone(),
                })
                .collect(),
        }
    }

    fn desired(&self) -> Desired {
        Desired {
            ports: self
                .ports
                .iter()
                .map(|(n, p)| DesiredPort {
                    name: n.clone(),
                    bonded: p.bonded,
                    layer2: p.layer2,
                    vlans: p.vlans.clone(),
                    native: p.native.clone(),
                })
                .collect(),
        }
    }
}

fn set(vs: &[&str]) -> BTreeSet<String> {
    vs.iter().map(|v| v.to_string()).collect()
}

/// The ports of a device by name.
type Ports = BTreeMap<String, P>;

/// Every valid state of one bond group (VLANs from a small universe).
fn group_states(bond: &str, members: &[&str], universe: &[&str]) -> Vec<Ports> {
    let subsets: Vec<BTreeSet<String>> = vec![
        set(&[]),
        set(&universe[..1]),
        set(&universe[1..2]),
        set(&universe[..2]),
    ];
    let natives = |vs: &BTreeSet<String>| -> Vec<Option<String>> {
        let mut out = vec![None];
        if vs.len() >= 2 {
            out.extend(vs.iter().map(|v| Some(v.clone())));
        }
        out
    };
    let port = |bonded, layer2, vlans: BTreeSet<String>, native| P {
        bonded,
        layer2,
        vlans,
        native,
    };
    let mut out = Vec::new();
    let mk = |b: P, m0: P, m1: P| {
        BTreeMap::from([
            (bond.to_string(), b),
            (members[0].to_string(), m0),
            (members[1].to_string(), m1),
        ])
    };
    let plain = |bonded| port(bonded, false, set(&[]), None);
    // layer3 and hybrid-bonded: VLANs (tagged) on the bond.
    for vs in &subsets {
        out.push(mk(
            port(true, false, vs.clone(), None),
            plain(true),
            plain(true),
        ));
    }
    // hybrid: the second member carries VLANs.
    for vs in &subsets {
        for n in natives(vs) {
            out.push(mk(
                plain(true),
                plain(true),
                port(false, false, vs.clone(), n),
            ));
        }
    }
    // layer2-bonded.
    for vs in &subsets {
        for n in natives(vs) {
            out.push(mk(
                port(true, true, vs.clone(), n),
                plain(true),
                plain(true),
            ));
        }
    }
    // layer2-individual: each member its own VLANs.
    for a in &subsets {
        for b in [&subsets[0], &subsets[3]] {
            for na in natives(a) {
                out.push(mk(
                    port(false, true, set(&[]), None),
                    port(false, false, a.clone(), na.clone()),
                    port(false, false, b.clone(), None),
                ));
            }
        }
    }
    out
}

fn run(from: &Model, to: &Model) -> Vec<PortStep> {
    let steps = plan(&from.observed(), &to.desired()).unwrap();
    let mut m = from.clone();
    for s in &steps {
        m.apply(s).unwrap_or_else(|e| {
            panic!(
                "{:?} → {:?}: step {s:?} refused: {e}\nplan: {steps:#?}",
                from.mode("bond0"),
                to.mode("bond0")
            )
        });
    }
    assert_eq!(
        m, *to,
        "the plan does not reach the desired state: {steps:#?}"
    );
    let again = plan(&m.observed(), &to.desired()).unwrap();
    assert!(again.is_empty(), "not converged: {again:#?}");
    steps
}

#[test]
fn every_transition_of_a_two_port_bond_is_accepted_and_converges() {
    let states = group_states("bond0", &["eth0", "eth1"], &["v-a", "v-b"]);
    let mut pairs = 0;
    let mut by_mode: BTreeMap<(Mode, Mode), usize> = BTreeMap::new();
    for a in &states {
        for b in &states {
            let from = Model {
                eth: 2,
                ports: a.clone(),
            };
            let to = Model {
                eth: 2,
                ports: b.clone(),
            };
            let steps = run(&from, &to);
            let k = (from.mode("bond0"), to.mode("bond0"));
            let e = by_mode.entry(k).or_default();
            *e = (*e).max(steps.len());
            pairs += 1;
        }
    }
    // Every pair of the five modes was covered.
    assert_eq!(by_mode.len(), 25, "{by_mode:?}");
    println!(
        "{pairs} transitions between {} states checked",
        states.len()
    );
}

#[test]
fn bonds_of_a_four_port_device_are_planned_independently() {
    let b0 = group_states("bond0", &["eth0", "eth2"], &["v-a", "v-b"]);
    let b1 = group_states("bond1", &["eth1", "eth3"], &["v-c", "v-d"]);
    let pick = |v: &Vec<Ports>, i: usize| v[i * 7 % v.len()].clone();
    let mut n = 0;
    for i in 0..b0.len() {
        for j in 0..6 {
            let mut a = pick(&b0, i);
            a.extend(pick(&b1, j));
            let mut b = pick(&b0, (i + 3) % b0.len());
            b.extend(pick(&b1, j + 2));
            run(&Model { eth: 4, ports: a }, &Model { eth: 4, ports: b });
            n += 1;
        }
    }
    assert!(n > 100);
}

/// A port as a test writes it: name, bonded, layer2, VLANs, native VLAN.
type PortRow<'a> = (&'a str, bool, bool, &'a [&'a str], Option<&'a str>);

fn model(ports: &[PortRow<'_>]) -> Model {
    Model {
        eth: 2,
        ports: ports
            .iter()
            .map(|(n, bonded, l2, vs, native)| {
                (
                    n.to_string(),
                    P {
                        bonded: *bonded,
                        layer2: *l2,
                        vlans: set(vs),
                        native: native.map(str::to_string),
                    },
                )
            })
            .collect(),
    }
}

fn names(steps: &[PortStep]) -> Vec<String> {
    steps
        .iter()
        .map(|s| format!("{} {}", s.port, s.action.name()))
        .collect()
}

#[test]
fn hybrid_to_layer2_bonded_goes_through_layer3() {
    let hybrid = model(&[
        ("bond0", true, false, &[], None),
        ("eth0", true, false, &[], None),
        ("eth1", false, false, &["v-a"], None),
    ]);
    let l2 = model(&[
        ("bond0", true, true, &["v-a", "v-b"], Some("v-a")),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let steps = run(&hybrid, &l2);
    assert_eq!(
        names(&steps),
        [
            "eth1 unassign-vlans",
            "eth1 bond",
            "bond0 convert-layer2",
            "bond0 assign-vlans",
            "bond0 set-native-vlan"
        ]
    );
    // k VLANs on a port are one batch, not k calls.
    assert_eq!(
        steps[3].action,
        Action::Assign(vec!["v-a".into(), "v-b".into()])
    );
}

#[test]
fn layer3_to_layer2_individual_converts_before_disbonding() {
    let l3 = model(&[
        ("bond0", true, false, &[], None),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let ind = model(&[
        ("bond0", false, true, &[], None),
        ("eth0", false, false, &["v-a"], None),
        ("eth1", false, false, &["v-b"], None),
    ]);
    assert_eq!(
        names(&run(&l3, &ind)),
        [
            "bond0 convert-layer2",
            "bond0 disbond",
            "eth0 assign-vlans",
            "eth1 assign-vlans"
        ]
    );
    assert_eq!(
        names(&run(&ind, &l3)),
        [
            "eth0 unassign-vlans",
            "eth1 unassign-vlans",
            "bond0 bond",
            "bond0 convert-layer3"
        ]
    );
}

#[test]
fn a_frozen_device_refuses_mode_changes_but_not_vlan_changes() {
    let hb = model(&[
        ("bond0", true, false, &["v-a"], None),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let hb2 = model(&[
        ("bond0", true, false, &["v-b"], None),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let l2 = model(&[
        ("bond0", true, true, &[], None),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let mut o = hb.observed();
    o.frozen = true;
    assert_eq!(plan(&o, &hb2.desired()).unwrap().len(), 2);
    let e = plan(&o, &l2.desired()).unwrap_err();
    assert_eq!((e.status(), e.reason()), (409, "NetworkFrozen"));
}

#[test]
fn the_dry_run_form_names_ports_actions_and_vlans() {
    let l3 = model(&[
        ("bond0", true, false, &[], None),
        ("eth0", true, false, &[], None),
        ("eth1", true, false, &[], None),
    ]);
    let hybrid = model(&[
        ("bond0", true, false, &[], None),
        ("eth0", true, false, &[], None),
        ("eth1", false, false, &["v-a"], None),
    ]);
    let steps = run(&l3, &hybrid);
    let v: Vec<_> = steps.iter().map(PortStep::to_json).collect();
    assert_eq!(
        v,
        [
            json!({"port": "eth1", "portId": "id-eth1", "action": "disbond", "bulk": false}),
            json!({"port": "eth1", "portId": "id-eth1", "action": "assign-vlans", "vlans": ["v-a"]}),
        ]
    );
}

// -- profiles ---------------------------------------------------------------

fn profile(spec: serde_json::Value) -> Result<Profile, metal_ipam_core::Error> {
    let p = Profile::from_json(&spec)?;
    p.validate()?;
    Ok(p)
}

fn refused(spec: serde_json::Value) -> String {
    let e = profile(spec).unwrap_err();
    assert_eq!(e.status(), 422, "{e}");
    e.field().unwrap_or_default().to_string()
}

#[test]
fn the_mode_is_derived_from_the_ports() {
    let modes = |spec| {
        profile(spec)
            .unwrap()
            .modes()
            .into_iter()
            .map(|(b, m)| (b.to_string(), m.as_str()))
            .collect::<Vec<_>>()
    };
    assert_eq!(modes(json!({})), [("bond0".to_string(), "layer3")]);
    assert_eq!(
        modes(json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"vxlan": 1010}]}]})),
        [("bond0".to_string(), "hybrid-bonded")]
    );
    assert_eq!(
        modes(
            json!({"metro": "da", "ports": [{"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1010}]}]})
        ),
        [("bond0".to_string(), "hybrid")]
    );
    assert_eq!(
        modes(json!({"ports": [{"name": "bond0", "layer2": true}]})),
        [("bond0".to_string(), "layer2-bonded")]
    );
    assert_eq!(
        modes(json!({"ports": [{"name": "bond0", "layer2": true, "bonded": false}]})),
        [("bond0".to_string(), "layer2-individual")]
    );
    assert_eq!(
        modes(json!({"ports": [{"name": "bond1", "layer2": true}]})),
        [
            ("bond0".to_string(), "layer3"),
            ("bond1".to_string(), "layer2-bonded")
        ]
    );
}

#[test]
fn impossible_profiles_are_refused_naming_the_field() {
    let uuid = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";
    // layer2 on a non-bond port.
    assert_eq!(
        refused(json!({"ports": [{"name": "eth1", "layer2": true}]})),
        "spec.ports[0].layer2"
    );
    // A Layer3 bond cannot be unbonded.
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "bonded": false}]})),
        "spec.ports[0].bonded"
    );
    // eth0 carries the Layer3 addresses.
    assert_eq!(
        refused(json!({"ports": [{"name": "eth0", "bonded": false}]})),
        "spec.ports[0].bonded"
    );
    // Native VLAN not among the port's VLANs, or with fewer than 2.
    assert_eq!(
        refused(
            json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": [{"vxlan": 1010}, {"vxlan": 1011}], "nativeVLAN": {"vxlan": 1012}}]})
        ),
        "spec.ports[0].nativeVLAN"
    );
    assert_eq!(
        refused(
            json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": [{"vxlan": 1010}], "nativeVLAN": {"vxlan": 1010}}]})
        ),
        "spec.ports[0].nativeVLAN"
    );
    // Hybrid-bonded with an untagged (native) VLAN.
    assert_eq!(
        refused(json!({"metro": "da", "ports": [{"name": "bond0",
            "vlans": [{"vxlan": 1010}, {"id": uuid}], "nativeVLAN": {"vxlan": 1010}}]})),
        "spec.ports[0].nativeVLAN"
    );
    // VLANs on a bonded member, on an unbonded bond, on the bond in hybrid.
    assert_eq!(
        refused(json!({"metro": "da", "ports": [{"name": "eth1", "vlans": [{"vxlan": 1010}]}]})),
        "spec.ports[0].vlans"
    );
    assert_eq!(
        refused(
            json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true, "bonded": false,
            "vlans": [{"vxlan": 1010}]}]})
        ),
        "spec.ports[0].vlans"
    );
    assert_eq!(
        refused(
            json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"vxlan": 1010}]},
            {"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1011}]}]})
        ),
        "spec.ports[0].vlans"
    );
    // Members of a layer2 bond follow it.
    assert_eq!(
        refused(
            json!({"ports": [{"name": "bond0", "layer2": true}, {"name": "eth1", "bonded": false}]})
        ),
        "spec.ports[1].bonded"
    );
    // VLAN references.
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "vlans": [{"vxlan": 1010}]}]})),
        "spec.ports[0].vlans[0].vxlan"
    );
    assert_eq!(
        refused(
            json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"vxlan": 1010, "id": uuid}]}]})
        ),
        "spec.ports[0].vlans[0]"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "vlans": [{"id": "nope"}]}]})),
        "spec.ports[0].vlans[0].id"
    );
    // Addresses, routes, MTU.
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "vlans": [{"id": uuid,
            "addresses": [{"static": "192.168.1.5"}]}]}]})),
        "spec.ports[0].vlans[0].addresses[0].static"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "vlans": [{"id": uuid,
            "routes": [{"to": "10.0.0.0/8", "via": "2001:db8::1"}]}]}]})),
        "spec.ports[0].vlans[0].routes[0].via"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "vlans": [{"id": uuid, "mtu": 9216}]}]})),
        "spec.ports[0].vlans[0].mtu"
    );
    // Types and unknown fields name their path.
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "layer2": "yes"}]})),
        "spec.ports[0].layer2"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "networkType": "layer2"}]})),
        "spec.ports[0].networkType"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "eth7"}]})),
        "spec.ports[0].name"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0"}, {"name": "bond0"}]})),
        "spec.ports[1].name"
    );
    // Elastic IPs: on bond0 or eth0 only, with bond0 in Layer3 or hybrid.
    let eip = json!([{"pool": {"name": "vrf"}}]);
    for ok in [
        json!({"ports": [{"name": "bond0", "elasticIPs": eip}]}),
        json!({"ports": [{"name": "eth0", "elasticIPs": eip}]}),
        json!({"metro": "da", "ports": [{"name": "bond0", "elasticIPs": eip, "vlans": [{"vxlan": 1010}]}]}),
        json!({"metro": "da", "ports": [{"name": "bond0", "elasticIPs": eip},
            {"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1010}]}]}),
    ] {
        profile(ok.clone()).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    assert_eq!(
        refused(json!({"ports": [{"name": "eth1", "bonded": false, "elasticIPs": eip}]})),
        "spec.ports[0].elasticIPs"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond1", "elasticIPs": eip}]})),
        "spec.ports[0].elasticIPs"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "layer2": true, "elasticIPs": eip}]})),
        "spec.ports[0].elasticIPs"
    );
    assert_eq!(
        refused(
            json!({"ports": [{"name": "bond0", "layer2": true, "bonded": false},
            {"name": "eth0", "elasticIPs": eip}]})
        ),
        "spec.ports[1].elasticIPs"
    );
    assert_eq!(
        refused(
            json!({"ports": [{"name": "bond0", "elasticIPs": [{"pool": {"name": "Bad_Name"}}]}]})
        ),
        "spec.ports[0].elasticIPs[0].pool.name"
    );
    assert_eq!(
        refused(json!({"ports": [{"name": "bond0", "elasticIPs": [{"address": "1.2.3.4/32"}]}]})),
        "spec.ports[0].elasticIPs[0].address"
    );
}

#[test]
fn the_device_decides_the_bonds_members() {
    // A 2-port profile taking eth1 out of bond0: on a 4-port device eth1
    // is bond1's first member, which stays bonded.
    let p = profile(
        json!({"metro": "da", "ports": [{"name": "eth1", "bonded": false,
        "vlans": [{"vxlan": 1012}]}]}),
    )
    .unwrap();
    let resolve = |_: &VlanRef| Some("8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11".to_string());
    assert!(Desired::from_profile(&p, 2, &resolve).is_ok());
    let e = Desired::from_profile(&p, 4, &resolve).unwrap_err();
    assert_eq!(e.field(), Some("spec.ports[0].bonded"), "{e}");
    assert_eq!(p.on_device(4).eth_ports(), 4);
}

#[test]
fn a_profile_resolves_to_every_port_of_the_device() {
    let p = profile(json!({"metro": "da", "ports": [
        {"name": "bond0", "layer2": true, "vlans": [{"vxlan": 1010}, {"pool": {"name": "vrf"}}],
         "nativeVLAN": {"vxlan": 1010}}]}))
    .unwrap();
    let resolve = |r: &metal_ipam_core::network::profile::VlanRef| match (r.vxlan, &r.pool) {
        (Some(1010), _) => Some("v-1010".to_string()),
        (_, Some(_)) => Some("v-pool".to_string()),
        _ => None,
    };
    let d = Desired::from_profile(&p, 2, &resolve).unwrap();
    let names: Vec<&str> = d.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["bond0", "eth0", "eth1"]);
    assert_eq!(d.ports[0].vlans, set(&["v-1010", "v-pool"]));
    assert_eq!(d.ports[0].native.as_deref(), Some("v-1010"));
    assert!(d.ports[1].bonded && d.ports[2].bonded);
    // A VLAN Metal does not know names its field.
    let none = |_: &metal_ipam_core::network::profile::VlanRef| None;
    let e = Desired::from_profile(&p, 2, &none).unwrap_err();
    assert_eq!(e.field(), Some("spec.ports[0].vlans[0]"));
    // A 4-port profile on a 2-port device.
    let four = profile(json!({"ports": [{"name": "bond1", "layer2": true}]})).unwrap();
    assert_eq!(
        Desired::from_profile(&four, 2, &resolve)
            .unwrap_err()
            .status(),
        422
    );
}

/// A profile takes a VLAN's address, and an elastic IP, from address pools
/// only: a prefix pool hands out networks, not host addresses (a VRF-backed
/// prefix pool's VLAN is named by its number instead).
#[test]
fn prefix_pools_give_no_host_addresses_to_profiles() {
    for kind in ["MetalPrefixPool", "GlobalMetalPrefixPool"] {
        let pool = json!({"kind": kind, "name": "pods"});
        assert_eq!(
            refused(
                json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"pool": pool}]}]})
            ),
            "spec.ports[0].vlans[0].pool.kind"
        );
        assert_eq!(
            refused(json!({"ports": [{"name": "bond0", "elasticIPs": [{"pool": pool}]}]})),
            "spec.ports[0].elasticIPs[0].pool.kind"
        );
        let e = profile(json!({"ports": [{"name": "bond0", "elasticIPs": [{"pool": pool}]}]}))
            .unwrap_err();
        assert!(
            e.message().contains("sub-prefixes, not host addresses"),
            "{e}"
        );
    }
    // The address pool kinds stay accepted.
    for kind in ["MetalIPPool", "GlobalMetalIPPool"] {
        let pool = json!({"kind": kind, "name": "vrf"});
        profile(json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"pool": pool}]}]}))
            .unwrap();
    }
}
