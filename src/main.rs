//! The `oomguard` binary: parses the command line, runs the subcommand and
//! turns its result into the process exit code. Only this file (and the TUI)
//! knows about the terminal.

use oomguard::cli::{Cli, Command};
use oomguard::run::run;
use oomguard::settings::Settings;

/// Writes to stdout, which is ours for these commands (no job runs).
fn print(text: &str) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("oomguard: cannot write to stdout: {e}");
            1
        }
    }
}

fn forensics(args: oomguard::cli::ForensicsArgs) -> i32 {
    use oomguard::forensics::{kernel, kmsg};
    let text = match &args.file {
        Some(p) if p.as_os_str() == "-" => {
            let mut s = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
                eprintln!("oomguard: cannot read stdin: {e}");
                return 2;
            }
            s
        }
        Some(p) => match std::fs::read(p) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                eprintln!("oomguard: cannot read '{}': {e}", p.display());
                return 2;
            }
        },
        None => match kmsg::read_kernel_log(args.since) {
            Ok(log) => log.text,
            Err(e) => {
                eprintln!("oomguard: {e}");
                return 1;
            }
        },
    };
    let kills = kernel::parse(&text);
    match args.format {
        oomguard::cli::ForensicsFormat::Text => print(&kernel::render_text(&kills)),
        oomguard::cli::ForensicsFormat::Json => {
            print(&format!("{:#}\n", kernel::render_json(&kills)))
        }
    }
}

fn report(args: oomguard::cli::ReportArgs) -> i32 {
    use oomguard::report::{Destination, run_report};
    match run_report(&args.log, args.output.as_deref(), args.format) {
        Ok(out) => {
            for w in &out.warnings {
                eprintln!("oomguard: {w}");
            }
            match out.destination {
                Destination::File(p) => {
                    eprintln!("oomguard: report written to {}", p.display());
                    0
                }
                Destination::Stdout(text) => print(&text),
            }
        }
        Err(e) => {
            eprintln!("oomguard: {e}");
            2
        }
    }
}

fn replay(args: oomguard::cli::ReplayArgs) -> i32 {
    use oomguard::replay;
    let policy = match oomguard::settings::replay_policy(&args.policy) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oomguard: {e}");
            return 2;
        }
    };
    let name = args.log.display().to_string();
    let result = if args.log.as_os_str() == "-" {
        replay::replay("stdin", std::io::stdin().lock(), policy)
    } else {
        match std::fs::File::open(&args.log) {
            Ok(f) => replay::replay(&name, std::io::BufReader::new(f), policy),
            Err(e) => {
                eprintln!("oomguard: cannot read '{name}': {e}");
                return 2;
            }
        }
    };
    match result {
        Ok(r) => match args.format {
            oomguard::cli::ForensicsFormat::Text => print(&replay::render_text(&name, &r)),
            oomguard::cli::ForensicsFormat::Json => print(&replay::render_json(&r)),
        },
        Err(e) => {
            eprintln!("oomguard: {e}");
            2
        }
    }
}

fn main() {
    let cli = Cli::parse_args();
    let code = match cli.command {
        Command::Run(args) => match Settings::for_run(*args) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("oomguard: {e}");
                2
            }
        },
        Command::Demo(args) => oomguard::demo::demo(args),
        Command::Forensics(args) => forensics(args),
        Command::Attach(args) => match Settings::for_attach(*args) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("oomguard: {e}");
                2
            }
        },
        Command::Report(args) => report(args),
        Command::Replay(args) => replay(args),
        Command::DemoJob { role, checkpoints } => match (role.as_str(), checkpoints) {
            ("worker", _) => oomguard::demo_job::worker(),
            ("trainer", Some(dir)) => oomguard::demo_job::trainer(&dir),
            _ => 2,
        },
        Command::Completions { shell } => {
            let mut cmd = Cli::command_with_defaults();
            clap_complete::generate(shell, &mut cmd, "oomguard", &mut std::io::stdout());
            0
        }
    };
    std::process::exit(code);
}
