//! `inlet`: command-line glue; everything else is in the library.

/// mimalloc instead of glibc's malloc: see docs/measurements.md, "The allocator".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    inlet::cli::main().await
}
