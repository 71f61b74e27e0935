//! The `sidecar-injector` binary: the command line is in the library (`sidecar_injector::cli`).

// mimalloc: the request path's few allocations (and the runtime's) are faster and fragment less than glibc's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sidecar_injector::cli::main(std::env::args_os())
}
