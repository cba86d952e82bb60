//! The `smp-relay` binary; the command line lives in `cli.rs`.

#[cfg(feature = "wip-server")]
mod cli;

#[cfg(feature = "wip-server")]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(not(feature = "wip-server"))]
fn main() {
    eprintln!("smp-relay was built without its server (temporary wip-server gate)");
    std::process::exit(1);
}
