//! The `smp-relay` binary; the command line lives in `cli.rs`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
