//! `inlet`: command-line glue; everything else is in the library.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    inlet::cli::main().await
}
