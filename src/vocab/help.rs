//! The text `--help` and the man page share beyond the flags: the exit
//! codes and the examples, written once here. `--help` shows them after
//! the options (`after_help`, see `cli`); `manpage` renders the same lists
//! as its EXIT STATUS and EXAMPLES sections.

use clap::builder::StyledStr;

use crate::vocab::exit;

/// One exit code of `oomguard run`: the code as written, and when it comes.
pub struct ExitCode {
    pub code: String,
    pub meaning: &'static str,
}

/// The exit codes of `oomguard run` (README's "Exit codes"), the job's own
/// first.
pub fn exit_codes() -> Vec<ExitCode> {
    let own = |code: i32, meaning| ExitCode {
        code: code.to_string(),
        meaning,
    };
    vec![
        ExitCode {
            code: "N".into(),
            meaning: "the job exited with N",
        },
        ExitCode {
            code: "128+S".into(),
            meaning: "the job was killed by signal S (by the kernel OOM killer: 137)",
        },
        ExitCode {
            code: "127, 126".into(),
            meaning: "the command was not found / is not executable",
        },
        own(
            exit::POLICY,
            "oomguard stopped the job (by policy: graceful stop, kill, restarts exhausted; \
             or after the save a TERM, USR1 or USR2 it received asked for): the stop code, \
             75 unless --stop-code says otherwise (EX_TEMPFAIL: safe to requeue)",
        ),
        own(
            crate::vocab::ended::NO_PROGRESS_EXIT,
            "oomguard stopped the job again without progress (--requeue-limit stops in a \
             row that passed no step beyond the one resumed from): do not requeue",
        ),
        ExitCode {
            code: "130".into(),
            meaning: "the job was saved and stopped on Ctrl-C or a SIGINT sent to oomguard",
        },
        own(
            exit::FAIL_ABOVE,
            "the job succeeded, but its peak PSS sum exceeded --fail-above",
        ),
        own(
            exit::OUTPUT_LOST,
            "the job succeeded, but its output could not all be written where oomguard's \
             goes (a full disk, an I/O error)",
        ),
        own(
            exit::INTERNAL,
            "oomguard's own failure (before the job starts, or a restart that cannot \
             launch it)",
        ),
        own(2, "usage or configuration error, before the job starts"),
    ]
}

/// What the other commands exit with.
pub const OTHER_COMMANDS: &str = "The other commands exit 0 on success, 2 on a usage error or \
     an input they cannot read, and 1 on another failure (doctor: a required check failed).";

/// One example: what it does, and the command line.
pub struct Example {
    pub what: &'static str,
    pub command: &'static str,
}

const fn ex(what: &'static str, command: &'static str) -> Example {
    Example { what, command }
}

/// `oomguard --help`'s examples: one per common task.
pub const TOP_EXAMPLES: &[Example] = &[
    ex(
        "What oomguard can do here; would a stop lose this trainer's work?",
        "oomguard doctor -- python train.py",
    ),
    ex(
        "Warn, checkpoint and stop before the OOM killer (the defaults)",
        "oomguard run --log run.ndjson -- bash train.sh",
    ),
    ex(
        "Watch a job started without oomguard",
        "oomguard attach --slurm-job 4242",
    ),
    ex(
        "The post-mortem of a run, with advice",
        "oomguard report run.ndjson -o report.html",
    ),
    ex(
        "Explain the kernel's OOM kills",
        "oomguard forensics /var/log/kern.log",
    ),
];

/// `oomguard run --help`'s examples.
pub const RUN_EXAMPLES: &[Example] = &[
    ex(
        "The defaults: warn, ask for a checkpoint, stop gracefully; log it all",
        "oomguard run --log run.ndjson -- bash train.sh --epochs 10",
    ),
    ex(
        "A ceiling of your own",
        "oomguard run --budget 40GiB -- python train.py",
    ),
    ex(
        "Restart from the checkpoint, at most 3 times",
        "oomguard run --on-critical restart --max-restarts 3 -- torchrun --nproc-per-node 8 train.py",
    ),
    ex(
        "Only observe and record",
        "oomguard run --policy none --log run.ndjson -- python train.py",
    ),
    ex(
        "CI: exit 76 when memory regresses",
        "oomguard run --fail-above 12GiB -- pytest tests/",
    ),
];

/// `text` as a heading, styled as clap styles its own ("Options:").
fn header(text: &str) -> String {
    let style = clap::builder::Styles::default();
    let h = style.get_header();
    format!("{h}{text}{h:#}")
}

fn examples_text(examples: &[Example]) -> String {
    let mut out = format!("{}\n", header("Examples:"));
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("  # {}\n  {}\n", e.what, e.command));
    }
    out
}

/// The width `--help`'s own lists are laid out for: clap wraps longer
/// lines, without their indent.
const WIDTH: usize = 80;

/// `text` in lines of at most [`WIDTH`] columns, each but the first
/// indented by `indent` spaces.
fn hang(text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut col = indent;
    for word in text.split_whitespace() {
        if col > indent && col + 1 + word.len() > WIDTH {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
        } else if col > indent {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out
}

fn exit_codes_text(title: &str) -> String {
    let codes = exit_codes();
    let width = codes.iter().map(|c| c.code.len()).max().unwrap_or(0);
    let mut out = format!("{}\n", header(title));
    for c in &codes {
        let meaning = hang(c.meaning, width + 4);
        out.push_str(&format!("  {:<width$}  {meaning}\n", c.code));
    }
    out
}

/// After `oomguard --help`'s commands: examples and exit codes.
pub fn top_after_help() -> StyledStr {
    let text = format!(
        "{}\n{}\n{}",
        examples_text(TOP_EXAMPLES),
        exit_codes_text("Exit status of oomguard run:"),
        hang(OTHER_COMMANDS, 0),
    );
    StyledStr::from(text)
}

/// After `oomguard run --help`'s options: examples and exit codes.
pub fn run_after_help() -> StyledStr {
    let text = format!(
        "{}\n{}",
        examples_text(RUN_EXAMPLES),
        exit_codes_text("Exit status:").trim_end(),
    );
    StyledStr::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_oomguard_run_is_listed() {
        let codes: Vec<String> = exit_codes().into_iter().map(|c| c.code).collect();
        for code in ["N", "128+S", "127, 126", "75", "76", "74", "70", "2"] {
            assert!(codes.iter().any(|c| c == code), "{code} missing: {codes:?}");
        }
    }

    #[test]
    fn every_example_parses() {
        use clap::Parser;
        for e in TOP_EXAMPLES.iter().chain(RUN_EXAMPLES) {
            let argv: Vec<&str> = e.command.split_whitespace().collect();
            assert!(
                crate::settings::cli::Cli::try_parse_from(&argv).is_ok(),
                "{}",
                e.command
            );
        }
    }
}
