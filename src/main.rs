//! The `oomguard` binary: parses the command line, runs the subcommand and
//! turns its result into the process exit code. Only this file (and the TUI)
//! knows about the terminal.

use oomguard::runtime::run;
use oomguard::settings::Settings;
use oomguard::settings::cli::Command;

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

/// Whether stdin carries data for us: a pipe or a redirected file. A
/// terminal, `/dev/null` (cron, systemd) or a socket do not, so
/// `oomguard forensics` with no path reads the live kernel log there.
fn stdin_has_data() -> bool {
    rustix::fs::fstat(std::io::stdin()).is_ok_and(|st| {
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        matches!(
            kind,
            rustix::fs::FileType::Fifo | rustix::fs::FileType::RegularFile
        )
    })
}

fn forensics(args: oomguard::settings::cli::ForensicsArgs) -> i32 {
    use oomguard::vocab::forensics::{kernel, kmsg};
    use std::io::{BufRead, BufReader, Write};
    let (mut input, name): (Box<dyn BufRead>, String) = match &args.file {
        Some(p) if p.as_os_str() == "-" => (Box::new(std::io::stdin().lock()), "stdin".into()),
        Some(p) => match std::fs::File::open(p) {
            Ok(f) => (
                Box::new(BufReader::with_capacity(1 << 16, f)),
                format!("'{}'", p.display()),
            ),
            Err(e) => {
                eprintln!("oomguard: cannot read '{}': {e}", p.display());
                return 2;
            }
        },
        None if stdin_has_data() => (Box::new(std::io::stdin().lock()), "stdin".into()),
        None => match kmsg::read_kernel_log(args.since) {
            Ok(log) => (
                Box::new(std::io::Cursor::new(log.text.into_bytes())),
                "the kernel log".into(),
            ),
            Err(e) => {
                eprintln!("oomguard: {e}");
                return 1;
            }
        },
    };
    let json = args.format == oomguard::settings::cli::ForensicsFormat::Json;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut writer = kernel::JsonWriter::default();
    let mut parser = kernel::StreamParser::new();
    let mut kills = Vec::new();
    let mut line = Vec::new();
    let mut replaced = 0usize;
    let mut written = if json { writer.begin(&mut out) } else { Ok(()) };
    let mut cut_lines = 0usize;
    loop {
        match oomguard::vocab::forensics::read_line_capped(
            &mut input,
            &mut line,
            oomguard::vocab::forensics::MAX_LINE_BYTES,
        ) {
            Ok((0, _)) => break,
            Ok((_, cut)) => cut_lines += usize::from(cut),
            Err(e) => {
                eprintln!("oomguard: cannot read {name}: {e}");
                return 2;
            }
        }
        // One bad byte must not cost the whole log: replace it and count.
        for chunk in line.utf8_chunks() {
            replaced += chunk.invalid().len();
        }
        parser.feed(&String::from_utf8_lossy(&line));
        if json {
            for k in parser.take_settled() {
                written = written.and_then(|()| writer.kill(&mut out, k));
            }
        }
    }
    let rest = parser.finish();
    if json {
        for k in rest {
            written = written.and_then(|()| writer.kill(&mut out, k));
        }
        written = written.and_then(|()| writer.end(&mut out));
    } else {
        kills.extend(rest);
        written = out.write_all(kernel::render_text(&kills).as_bytes());
    }
    if cut_lines > 0 {
        eprintln!(
            "oomguard: {cut_lines} line{} of {name} longer than {} MiB {} cut there (no kernel report has such lines)",
            if cut_lines == 1 { "" } else { "s" },
            oomguard::vocab::forensics::MAX_LINE_BYTES >> 20,
            if cut_lines == 1 { "was" } else { "were" }
        );
    }
    if replaced > 0 {
        eprintln!(
            "oomguard: {replaced} byte{} of {name} {} not UTF-8 and replaced with U+FFFD",
            if replaced == 1 { "" } else { "s" },
            if replaced == 1 { "was" } else { "were" }
        );
    }
    match written.and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("oomguard: cannot write to stdout: {e}");
            1
        }
    }
}

fn report(args: oomguard::settings::cli::ReportArgs) -> i32 {
    use oomguard::settings::cli::ReportFormat;
    use oomguard::tools::report::{Destination, Format, run_reports};
    let format = match args.format {
        ReportFormat::Html => Format::Html,
        ReportFormat::Text => Format::Text,
        ReportFormat::Json => Format::Json,
    };
    let pick = oomguard::sinks::log::runs::RunPick::from_arg(args.run);
    match run_reports(&args.logs, args.output.as_deref(), format, pick) {
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

fn replay(args: oomguard::settings::cli::ReplayArgs) -> i32 {
    use oomguard::tools::replay;
    let policy = match oomguard::settings::replay_policy(&args.policy) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oomguard: {e}");
            return 2;
        }
    };
    let pick = oomguard::sinks::log::runs::RunPick::from_arg(args.run);
    if args.score {
        return replay_score(&args.logs, policy, args.format, args.run);
    }
    let [log] = args.logs.as_slice() else {
        eprintln!("oomguard: replay takes one log (or --score with several)");
        return 2;
    };
    let name = log.display().to_string();
    match replay_one(log, policy, pick) {
        Ok((r, (n, of))) => {
            if of > 1 {
                eprintln!(
                    "oomguard: {name} holds {of} runs; this is run {n} (--run N for another)"
                );
            }
            match args.format {
                oomguard::settings::cli::ForensicsFormat::Text => {
                    print(&replay::render_text(&name, &r))
                }
                oomguard::settings::cli::ForensicsFormat::Json => print(&replay::render_json(&r)),
            }
        }
        Err(e) => {
            eprintln!("oomguard: {e}");
            2
        }
    }
}

/// Replays run `pick` of one log: the replay, and (which run, of how many).
fn replay_one(
    log: &std::path::Path,
    policy: Option<(oomguard::engine::policy::Policy, String)>,
    pick: oomguard::sinks::log::runs::RunPick,
) -> Result<(oomguard::tools::replay::Replay, (usize, usize)), String> {
    use oomguard::tools::replay;
    let name = if log.as_os_str() == "-" {
        "stdin".to_string()
    } else {
        log.display().to_string()
    };
    let run = oomguard::sinks::log::runs::open(log, pick).map_err(|e| match e {
        oomguard::sinks::log::runs::OpenRunError::Read(e) => format!("cannot read '{name}': {e}"),
        oomguard::sinks::log::runs::OpenRunError::NoSuchRun(e) => format!("{name}: {e}"),
    })?;
    let r = replay::replay(&name, run.reader, policy).map_err(|e| e.to_string())?;
    Ok((r, (run.index, run.of)))
}

/// `replay --score`: every run of every log (or run `--run N` of each)
/// under the policy and under its fixed threshold alone.
fn replay_score(
    logs: &[std::path::PathBuf],
    policy: Option<(oomguard::engine::policy::Policy, String)>,
    format: oomguard::settings::cli::ForensicsFormat,
    run: Option<u64>,
) -> i32 {
    use oomguard::sinks::log::runs::{self, RunPick};
    use oomguard::tools::replay::score;
    let mut rows = Vec::new();
    let mut source = String::from("recorded");
    for log in logs {
        let picks: Vec<RunPick> = match run {
            Some(_) => vec![RunPick::from_arg(run)],
            None => match runs::count(log) {
                Ok(of) => (1..=of).map(RunPick::Nth).collect(),
                Err(e) => {
                    eprintln!("oomguard: cannot read '{}': {e}", log.display());
                    return 2;
                }
            },
        };
        for pick in picks {
            let scored = replay_one(log, policy.clone(), pick).and_then(|(r, (n, of))| {
                let fixed = score::fixed_threshold(&r.policy);
                let (f, _) = replay_one(log, Some((fixed, "fixed threshold".into())), pick)?;
                source.clone_from(&r.policy_source);
                let name = if of > 1 {
                    format!("{} (run {n} of {of})", log.display())
                } else {
                    log.display().to_string()
                };
                Ok(score::score(&name, &r, &f))
            });
            match scored {
                Ok(s) => rows.push(s),
                Err(e) => {
                    eprintln!("oomguard: {e}");
                    return 2;
                }
            }
        }
    }
    match format {
        oomguard::settings::cli::ForensicsFormat::Text => {
            print(&score::render_text(&source, &rows))
        }
        oomguard::settings::cli::ForensicsFormat::Json => {
            let mut out = String::new();
            for r in &rows {
                out.push_str(&serde_json::to_string(r).unwrap_or_default());
                out.push('\n');
            }
            print(&out)
        }
    }
}

/// `oomguard doctor [-- CMD]`: the report on stdout, the exit code from
/// the required checks. With a command, the command's own output goes to
/// stderr, so stdout holds the report alone (JSON stays parseable).
fn doctor(args: oomguard::settings::cli::DoctorArgs) -> i32 {
    use oomguard::tools::doctor;
    let env = doctor::Env {
        nvml_lib: args.nvml_lib.clone(),
        python: doctor::Interpreter::for_command(&args.command),
        ..doctor::Env::default()
    };
    let mut report = doctor::diagnose(&env);
    if !args.command.is_empty() {
        let saved = rustix::io::dup(std::io::stdout());
        if let Err(e) = rustix::stdio::dup2_stdout(std::io::stderr()) {
            eprintln!("oomguard: cannot send the command's output to stderr: {e}");
        }
        let probed = doctor::probe::probe(&args.command, args.wait);
        if let Ok(fd) = &saved
            && let Err(e) = rustix::stdio::dup2_stdout(fd)
        {
            eprintln!("oomguard: cannot restore stdout: {e}");
            return 1;
        }
        match probed {
            Ok(p) => doctor::add_probe(&mut report, p),
            Err(e) => {
                eprintln!("oomguard: {e}");
                return 2;
            }
        }
    }
    let text = match args.format {
        oomguard::settings::cli::ForensicsFormat::Text => report.render_text(),
        oomguard::settings::cli::ForensicsFormat::Json => report.render_json(),
    };
    match print(&text) {
        0 => report.exit_code(),
        e => e,
    }
}

/// `oomguard man`: a page on stdout, or every page into a directory.
fn man(command: Option<&str>, out: Option<&std::path::Path>) -> i32 {
    use oomguard::tools::manpage;
    let page = match (command, out) {
        (_, Some(dir)) => manpage::write_all(dir).map(|paths| {
            let mut list = String::new();
            for p in paths {
                list.push_str(&format!("{}\n", p.display()));
            }
            list.into_bytes()
        }),
        (Some(name), None) => manpage::command_page(name),
        (None, None) => manpage::main_page(),
    };
    match page {
        Ok(text) => print(&String::from_utf8_lossy(&text)),
        Err(e) => {
            eprintln!("oomguard: {e}");
            match e {
                manpage::ManError::NoSuchCommand(..) => 2,
                _ => 1,
            }
        }
    }
}

/// `oomguard checkpoint`: the `done` record on stdout, exit 0; else the
/// reason on stderr, exit 1.
fn checkpoint(args: &oomguard::settings::cli::CheckpointArgs) -> i32 {
    // clap requires one way of naming the job.
    let Some(target) = args.job.target() else {
        eprintln!("oomguard: checkpoint: name a pid, --cgroup, --slurm-job or --match");
        return 2;
    };
    match oomguard::tools::ask::checkpoint(&target, std::path::Path::new("/proc"), args.timeout) {
        Ok(done) => {
            print(&format!("{done}\n"));
            0
        }
        Err(e) => {
            eprintln!("oomguard: {e}");
            // Which job was meant is the user's to say: a usage error.
            if matches!(e, oomguard::tools::ask::AskError::Ambiguous { .. }) {
                2
            } else {
                1
            }
        }
    }
}

fn ended(args: &oomguard::settings::cli::EndedArgs) -> i32 {
    let cwd = std::env::current_dir().unwrap_or_default();
    let job = std::env::var("SLURM_JOB_ID").ok();
    let a = oomguard::tools::ended::answer(args, job, &cwd);
    print(&a.stdout);
    eprint!("{}", a.stderr);
    a.code
}

fn main() {
    let cli = oomguard::settings::parse_cli();
    let code = match cli.command {
        Command::Run(args) => match Settings::for_run(*args) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("oomguard: {e}");
                2
            }
        },
        Command::Demo(args) => oomguard::tools::demo::demo(args),
        Command::Forensics(args) => forensics(args),
        Command::Attach(args) => match Settings::for_attach(*args) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("oomguard: {e}");
                2
            }
        },
        Command::Report(args) => report(args),
        Command::Doctor(args) => doctor(args),
        Command::Checkpoint(args) => checkpoint(&args),
        Command::Ended(args) => ended(&args),
        Command::Replay(args) => replay(args),
        Command::DemoJob { role, checkpoints } => match (role.as_str(), checkpoints) {
            ("worker", _) => oomguard::vocab::demo_job::worker(),
            ("trainer", Some(dir)) => oomguard::vocab::demo_job::trainer(&dir),
            _ => 2,
        },
        Command::Keep { pairs } => oomguard::job::keeper::run(&pairs),
        Command::Completions { shell } => {
            let mut cmd = oomguard::settings::command();
            clap_complete::generate(shell, &mut cmd, "oomguard", &mut std::io::stdout());
            0
        }
        Command::Man { command, out } => man(command.as_deref(), out.as_deref()),
    };
    std::process::exit(code);
}
