//! `densevm`: the command-line front end. Only this crate sees every other crate;
//! nothing depends on it.

mod cmd;
mod output;

use clap::{Parser, Subcommand};

/// densevm: a KVM virtual machine monitor built for memory density.
#[derive(Parser, Debug)]
#[command(name = "densevm", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `densevm_vmm=debug`.
    #[arg(long, global = true, env = "DENSEVM_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

// Deferred: only the subcommand given is built (its arguments, and the subcommands under
// it), which halves the parse's cost at a VM's start. The structs' own doc comments are
// therefore plain comments: a deferred `about` would override the variant's.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum Command {
    /// Create a VM and run it to completion.
    Run(Box<cmd::run::RunArgs>),
    /// Create, inspect and modify pcow images (qemu-img-like verbs).
    Image(cmd::image::ImageArgs),
    /// Serve a host directory over 9P2000.L.
    #[command(name = "9p")]
    NineP(cmd::ninep::NinePArgs),
    /// Kernel image utilities (extract the ELF vmlinux from a bzImage).
    Kernel(cmd::kernel::KernelArgs),
    /// Control a running VM through its API socket: info, pause, resume, snapshot, clone.
    Vm(cmd::vm::VmArgs),
    /// Type into a VM's serial console (its --console-sock) and wait for its answer.
    Console(cmd::console::ConsoleArgs),
    /// Run many VMs under one memory policy (serve), and its client verbs.
    Fleet(cmd::fleet::FleetArgs),
    /// Run a command in a guest through its agent over vsock (the VM needs --vsock):
    /// stdin forwarded, stdout/stderr printed, the command's exit code returned.
    Exec(cmd::exec::ExecArgs),
}

static PROCESS_START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// The instant `main` started: the origin of the boot trace.
pub fn process_start() -> std::time::Instant {
    *PROCESS_START.get_or_init(std::time::Instant::now)
}

fn main() {
    process_start();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(args) => cmd::run::main(*args),
        Command::Image(args) => cmd::image::main(args),
        Command::NineP(args) => cmd::ninep::main(args),
        Command::Kernel(args) => cmd::kernel::main(args),
        Command::Vm(args) => cmd::vm::main(args),
        Command::Console(args) => cmd::console::main(args),
        Command::Fleet(args) => cmd::fleet::main(args),
        Command::Exec(args) => cmd::exec::main(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("densevm: error: {}", output::error_chain(&err));
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Subcommands are built when used (`defer`): what they add then must not replace the
    /// description `densevm --help` lists them with.
    #[test]
    fn deferred_subcommands_keep_their_description() {
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            let listed = sub.get_about().map(|a| a.to_string());
            assert!(listed.is_some(), "`{}` has no description", sub.get_name());
            let mut built = sub.clone();
            built.build();
            assert_eq!(
                built.get_about().map(|a| a.to_string()),
                listed,
                "`densevm {} --help` describes it otherwise than `densevm --help`",
                sub.get_name()
            );
            assert!(
                built.get_arguments().count() > 0 || built.has_subcommands(),
                "`{}` was built without its arguments",
                sub.get_name()
            );
        }
    }

    /// A restore takes RAM, vCPUs and merging from its snapshot: saying otherwise is an
    /// error, not a flag silently ignored.
    #[test]
    fn a_restore_refuses_what_the_snapshot_decides() {
        use clap::Parser;
        for flag in [["--memory", "512M"], ["--cpus", "2"], ["--merge", "all"]] {
            let err =
                Cli::try_parse_from(["densevm", "run", "--restore", "/snap", flag[0], flag[1]])
                    .expect_err(flag[0]);
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{flag:?}"
            );
        }
        assert!(Cli::try_parse_from(["densevm", "run", "--restore", "/snap"]).is_ok());
    }
}
