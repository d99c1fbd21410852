//! The `oomguard` binary: parses the command line, runs the subcommand and
//! turns its result into the process exit code. Only this file (and the TUI)
//! knows about the terminal.

use clap::Parser;
use oomguard::cli::{Cli, Command};
use oomguard::run::{RunConfig, run};

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => match RunConfig::from_args(*args) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("oomguard: {e}");
                2
            }
        },
        Command::Demo(args) => oomguard::demo::demo(args),
    };
    std::process::exit(code);
}
