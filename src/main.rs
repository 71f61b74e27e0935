//! The `sidecar-injector` binary: parse the command line, run the subcommand, report errors.
//!
//! Exit codes: 0 success; 1 the input or a template was refused (the reason is on stderr); 2 usage error.

mod cli;

use clap::Parser;

// mimalloc: the request path's few allocations (and the runtime's) are faster and fragment less than glibc's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let result = match &cli.command {
        cli::Command::Serve(args) => cli::serve::run(args),
        cli::Command::Review(args) => cli::review::run(args),
        cli::Command::Check(args) => cli::check::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sidecar-injector: {message}");
            std::process::ExitCode::from(1)
        }
    }
}
