//! Man pages, generated from the command-line definitions (`clap_mangen`),
//! so they can never disagree with `--help`.
//!
//! `oomguard(1)` is the whole reference in one page: what `--help` of the
//! command and of every subcommand says, each subcommand in a section of
//! its own, so that one file installed by hand gives `man oomguard` all of
//! it. `oomguard-run(1)` and its siblings are the pages of one subcommand
//! each, the way git lays its pages out, for those who install them all.
//! Hidden subcommands (internal ones oomguard starts itself) have none.
//! The EXIT STATUS and EXAMPLES sections come from `help`, as do the
//! lists after `--help`'s options.

use std::path::{Path, PathBuf};

use clap_mangen::Man;

use crate::vocab::help;

/// Why a page could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ManError {
    #[error("no subcommand {0:?} (one of: {1})")]
    NoSuchCommand(String, String),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("cannot render the page: {0}")]
    Render(std::io::Error),
}

/// The command line as the binary parses it, built, so that subcommands
/// know their full names (`oomguard-run`).
fn built() -> clap::Command {
    let mut cmd = crate::settings::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn man(cmd: clap::Command) -> Man {
    Man::new(cmd).manual("oomguard manual")
}

/// The subcommands that have a page, in `--help` order.
fn visible(cmd: &clap::Command) -> Vec<&clap::Command> {
    let mut subs: Vec<&clap::Command> =
        cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    subs.sort_by_key(|s| s.get_display_order());
    subs
}

/// The names of the subcommands that have a page.
pub fn commands() -> Vec<String> {
    visible(&built())
        .iter()
        .map(|s| s.get_name().to_string())
        .collect()
}

type Section = fn(&Man, &mut dyn std::io::Write) -> std::io::Result<()>;

/// Appends `sections` of `page` to `out`. Each starts with the same roff
/// preamble (a string definition), which the page's title already has;
/// `demote` makes them subsections, for a subcommand's part of a page.
fn append(
    out: &mut Vec<u8>,
    page: &Man,
    sections: &[Section],
    demote: bool,
) -> Result<(), ManError> {
    for render in sections {
        let mut part = Vec::new();
        render(page, &mut part).map_err(ManError::Render)?;
        for line in String::from_utf8_lossy(&part).lines() {
            if line.starts_with(".ie \\n(.g .ds Aq") || line.starts_with(".el .ds Aq") {
                continue;
            }
            let line = match line.strip_prefix(".SH ") {
                Some(title) if demote => format!(".SS {title}"),
                _ => line.to_string(),
            };
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    Ok(())
}

/// `oomguard(1)` with every subcommand's synopsis, description and options
/// (its own page's sections, one level down), in roff.
pub fn main_page() -> Result<Vec<u8>, ManError> {
    let cmd = built();
    let page = man(cmd.clone());
    let mut out = Vec::new();
    page.render_title(&mut out).map_err(ManError::Render)?;
    append(
        &mut out,
        &page,
        &[
            Man::render_name_section,
            Man::render_synopsis_section,
            Man::render_description_section,
            Man::render_options_section,
            Man::render_subcommands_section,
        ],
        false,
    )?;
    for sub in visible(&cmd) {
        let name = sub.get_display_name().unwrap_or(sub.get_name());
        let heading = name.replace('-', " ").to_uppercase();
        out.extend_from_slice(format!(".SH \"{heading}\"\n").as_bytes());
        append(
            &mut out,
            &man(sub.clone()),
            &[
                Man::render_synopsis_section,
                Man::render_description_section,
                Man::render_options_section,
            ],
            true,
        )?;
    }
    out.extend_from_slice(exit_status().as_bytes());
    let mut all = help::TOP_EXAMPLES.iter().chain(help::RUN_EXAMPLES);
    out.extend_from_slice(examples(&mut all).as_bytes());
    append(&mut out, &page, &[Man::render_version_section], false)?;
    Ok(ascii(out))
}

/// `text` as roff text: backslashes and minus signs escaped, and a line
/// that would start with a control character made plain.
fn roff(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    match text.chars().next() {
        Some('.' | '\'') => format!("\\&{text}"),
        _ => text,
    }
}

/// The EXIT STATUS section: `oomguard run`'s codes, then the others'.
fn exit_status() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    out.push_str(&format!(
        "{}\n",
        roff("oomguard run exits with the job's own status, or with one of these:")
    ));
    for c in help::exit_codes() {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff(&c.code),
            roff(c.meaning)
        ));
    }
    out.push_str(&format!(".PP\n{}\n", roff(help::OTHER_COMMANDS)));
    out
}

/// The EXAMPLES section: each example's purpose, then its command line.
fn examples(list: &mut dyn Iterator<Item = &help::Example>) -> String {
    let mut out = String::from(".SH EXAMPLES\n");
    for e in list {
        out.push_str(&format!(
            ".PP\n{}\n.RS 4\n.nf\n\\fB{}\\fR\n.fi\n.RE\n",
            roff(e.what),
            roff(e.command)
        ));
    }
    out
}

/// `text` in ASCII: any other character as a roff escape (`×` as
/// `\[u00D7]`), which every troff reads whatever the locale, where a raw
/// one needs `preconv` in front.
fn ascii(text: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8_lossy(&text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", u32::from(c)));
        }
    }
    out.into_bytes()
}

/// The page of subcommand `name` alone (`oomguard-run(1)`), in roff.
pub fn command_page(name: &str) -> Result<Vec<u8>, ManError> {
    let cmd = built();
    let sub = visible(&cmd)
        .into_iter()
        .find(|s| s.get_name() == name)
        .ok_or_else(|| ManError::NoSuchCommand(name.to_string(), commands().join(", ")))?;
    // `--help`'s lists after the options come as sections of their own
    // below, not as clap_mangen's EXTRA.
    let page = man(sub.clone().after_help(clap::builder::Resettable::Reset));
    let mut out = Vec::new();
    page.render_title(&mut out).map_err(ManError::Render)?;
    append(
        &mut out,
        &page,
        &[
            Man::render_name_section,
            Man::render_synopsis_section,
            Man::render_description_section,
            Man::render_options_section,
        ],
        false,
    )?;
    if name == "run" {
        out.extend_from_slice(exit_status().as_bytes());
        out.extend_from_slice(examples(&mut help::RUN_EXAMPLES.iter()).as_bytes());
    }
    append(&mut out, &page, &[Man::render_version_section], false)?;
    Ok(ascii(out))
}

/// Writes `oomguard.1` and `oomguard-SUBCOMMAND.1` for every subcommand
/// into `dir` (which must exist) and returns their paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, ManError> {
    let mut pages = vec![("oomguard.1".to_string(), main_page()?)];
    for name in commands() {
        pages.push((format!("oomguard-{name}.1"), command_page(&name)?));
    }
    pages
        .into_iter()
        .map(|(file, text)| {
            let path = dir.join(file);
            std::fs::write(&path, text).map_err(|e| ManError::Write(path.clone(), e))?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_page_has_a_section_per_subcommand() {
        let page = String::from_utf8(main_page().unwrap()).unwrap();
        assert!(page.contains(".TH oomguard 1"), "{page}");
        // The preamble once, from the title.
        assert_eq!(page.matches(".ds Aq").count(), 2, "{page}");
        for name in commands() {
            let heading = format!(".SH \"OOMGUARD {}\"", name.to_uppercase());
            assert!(page.contains(&heading), "{heading} missing");
        }
        assert!(!page.contains("demo-job") && !page.contains("OOMGUARD KEEP"));
        assert!(page.contains(".SS OPTIONS"));
        assert!(page.is_ascii());
        // The headings of run's options are subsections of its section.
        assert!(page.contains(".SS \"BUDGET AND POLICY\""), "{page}");
        for section in [".SH \"EXIT STATUS\"", ".SH EXAMPLES"] {
            assert_eq!(page.matches(section).count(), 1, "{section}");
        }
        assert!(page.contains("\\fB75\\fR"));
        assert!(page.contains("oomguard run \\-\\-budget 40GiB \\-\\- python train.py"));
    }

    #[test]
    fn run_s_page_has_its_exit_status_and_examples_and_no_extra() {
        let page = String::from_utf8(command_page("run").unwrap()).unwrap();
        assert!(page.contains(".SH \"EXIT STATUS\"") && page.contains(".SH EXAMPLES"));
        assert!(!page.contains(".SH EXTRA"), "{page}");
        assert!(page.contains(".SH VERSION"), "{page}");
        assert_eq!(page.matches(".ds Aq").count(), 2, "{page}");
    }

    #[test]
    fn an_unknown_subcommand_is_an_error() {
        let e = command_page("nope").unwrap_err().to_string();
        assert!(e.contains("run") && e.contains("nope"), "{e}");
        assert!(command_page(crate::job::keeper::ARG).is_err());
    }
}
