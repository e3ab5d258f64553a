//! `macvtap-deviceplugin`: parse flags, set up logging, run the daemon.

use macvtap_deviceplugin::cli::{self, Args, Command, DoctorArgs, Output};
use macvtap_deviceplugin::operator::doctor;
use macvtap_deviceplugin::{daemon, install, logging};
use std::process::ExitCode;

fn main() -> ExitCode {
    let line = cli::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let filter = match logging::rust_log().and_then(|v| line.log_filter(v.as_deref())) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let args = line.args;
    logging::init(args.log_format, filter);
    if let Some(w) = line.glog.warning(args.log_level.is_some()) {
        tracing::warn!("{w}");
    }
    if let Some(Command::InstallCni(i)) = &args.command {
        return match install::install(
            &i.source,
            &i.target_dir,
            &i.name,
            &args.kubelet_dir,
            i.pod_resources_check,
        ) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Doctor(d)) = &args.command {
        return run_doctor(&args, d);
    }
    // Sockets and any other file the daemon creates are for root only,
    // whatever umask the runtime started us with (see kubelet_proto::transport::bind_unix).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(daemon::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "macvtap-deviceplugin failed");
            ExitCode::FAILURE
        }
    }
}

/// `doctor`: checks the node, prints the findings, exits 1 on a problem.
fn run_doctor(args: &Args, d: &DoctorArgs) -> ExitCode {
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let target = doctor::Target {
        cni_bin_dir: d.cni_bin_dir.clone(),
        cni_name: d.cni_name.clone(),
        dev_dir: "/dev".into(),
        proc_dir: "/proc".into(),
    };
    let findings = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r.block_on(doctor::run(&opts, &target)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match d.output {
        Output::Text => print!("{}", doctor::render_text(&findings)),
        Output::Json => println!("{}", doctor::render_json(&findings)),
    }
    if doctor::has_problem(&findings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
