//! Builds the test guest into `target/e2e-guest` and prints its paths.

fn main() -> std::process::ExitCode {
    macvtap_e2e::exit::report(run())
}

fn run() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-guest");
    let g = macvtap_e2e::guest::build(&dir)?;
    println!(
        "{}\n{}\n{}",
        g.kernel.display(),
        g.initrd.display(),
        g.release
    );
    Ok(())
}
