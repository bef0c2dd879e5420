//! Runs the Metal simulator standalone, for local demos:
//!
//! ```text
//! cargo run -p metal-ipam-tests --bin metal-sim -- [--port N] [--token T] [--project P]
//!     [--gateway-reads N] [--max-per-page N]
//! ```
//!
//! Prints the base URL, token, project id and a seeded device (metro `da`,
//! `bond0` + `eth0`, `eth1`), then serves until killed. On exit (Ctrl-C)
//! it prints the spec violations it saw.

use std::process::ExitCode;

use metal_ipam_tests::metal_sim::{MetalSim, SimConfig};

const USAGE: &str = "usage: metal-sim [--port N] [--token T] [--project P] \
                     [--gateway-reads N] [--max-per-page N]";

/// The id of the device seeded for demos.
const DEMO_DEVICE: &str = "0d5e7c1a-51a8-4b0c-9f3e-5d1e2c7a9b10";

fn parse(args: &[String]) -> Result<SimConfig, String> {
    let mut cfg = SimConfig::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let number = |v: String| {
            v.parse::<u32>()
                .map_err(|_| format!("{flag}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--port" => {
                let v = value()?;
                cfg.port = v
                    .parse()
                    .map_err(|_| format!("--port: {v:?} is not a port"))?;
            }
            "--token" => cfg.token = Some(value()?),
            "--project" => cfg.project_id = Some(value()?),
            "--gateway-reads" => cfg.gateway_reads = Some(number(value()?)?),
            "--max-per-page" => cfg.max_per_page = Some(number(value()?)?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(cfg)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse(&args) {
        Ok(cfg) => cfg,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let sim = match MetalSim::start_with(cfg).await {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("metal-sim: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let device = sim.add_device(DEMO_DEVICE, "da", 2);
    println!("base_url: {}", sim.base_url());
    println!("token: {}", sim.token());
    println!("project: {}", sim.project_id());
    println!("device: {} (metro da)", device.id);
    for port in &device.ports {
        println!("  port {}: {}", port.name, port.id);
    }
    println!("serving until killed (Ctrl-C)");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("metal-sim: waiting for Ctrl-C: {e}");
        return ExitCode::FAILURE;
    }
    for v in sim.violations() {
        println!("violation: {v}");
    }
    for v in sim.answer_violations() {
        println!("answer violation: {v}");
    }
    ExitCode::SUCCESS
}
