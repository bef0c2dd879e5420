//! Runs the phoenixNAP simulator standalone, for local demos:
//!
//! ```text
//! cargo run -p metal-ipam-tests --bin pnap-sim -- [--port N] [--client-id I] [--client-secret S]
//! ```
//!
//! Prints the base URL (give it to the app as both `pnap_api_url` and
//! `pnap_auth_url`), the client credentials and two seeded servers in
//! location PHX, then serves until killed. On exit (Ctrl-C) it prints the
//! spec violations it saw.

use std::process::ExitCode;

use metal_ipam_tests::pnap_sim::{PnapSim, SimConfig};

const USAGE: &str = "usage: pnap-sim [--port N] [--client-id I] [--client-secret S]";

/// The servers seeded for demos (phoenixNAP ids are 24 hex digits).
const DEMO_SERVERS: [(&str, &str); 2] = [
    ("5fa54d1e91867c03a0a7b4a1", "demo-node-1"),
    ("5fa54d1e91867c03a0a7b4a2", "demo-node-2"),
];

fn parse(args: &[String]) -> Result<SimConfig, String> {
    let mut cfg = SimConfig::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--port" => {
                let v = value()?;
                cfg.port = v
                    .parse()
                    .map_err(|_| format!("--port: {v:?} is not a port"))?;
            }
            "--client-id" => cfg.client_id = value()?,
            "--client-secret" => cfg.client_secret = value()?,
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
    let sim = match PnapSim::start_with(cfg).await {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("pnap-sim: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("base_url: http://{}", sim.addr());
    println!("client_id: {}", sim.client_id());
    println!("client_secret: {}", sim.client_secret());
    for (id, host) in DEMO_SERVERS {
        sim.add_server(id, host, "PHX");
        println!("server: {id} ({host}, location PHX)");
    }
    println!("serving until killed (Ctrl-C)");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("pnap-sim: waiting for Ctrl-C: {e}");
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
