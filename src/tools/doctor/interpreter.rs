//! Which Python the `python` check asks: with `doctor -- CMD`, the one the
//! command runs, when the command says which; otherwise `python3` on
//! `PATH`, as a job started from this shell would find it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::checks::which;

/// The Python interpreter the `python` check runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Interpreter {
    /// No command: `python3` on `PATH`.
    #[default]
    OnPath,
    /// The command's own interpreter (`<venv>/bin/python train.py`,
    /// `torchrun …` through its `#!` line).
    OfCommand(PathBuf),
    /// A command that does not say which Python it runs (`bash train.sh`):
    /// `python3` on `PATH`, said so.
    Unknown,
}

impl Interpreter {
    /// The interpreter `argv` runs (see [`of_command`]); [`Self::OnPath`]
    /// without a command.
    pub fn for_command(argv: &[OsString]) -> Self {
        if argv.is_empty() {
            return Self::OnPath;
        }
        of_command(argv).map_or(Self::Unknown, Self::OfCommand)
    }
}

/// The Python `argv` runs: `argv[0]` when it is one (`python`,
/// `python3.11`, `/venv/bin/python`), the command after `env` (its options
/// and `NAME=VALUE` settings skipped), or the `#!` interpreter of a script
/// such as `torchrun` or `./train.py` when that is a Python. `None` when
/// the command does not say (`bash train.sh`: what the script runs is not
/// known before it runs).
pub fn of_command(argv: &[OsString]) -> Option<PathBuf> {
    let words: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let program = resolve(after_env(&words)?)?;
    if is_python(&program) {
        return Some(program);
    }
    let line = shebang(&program)?;
    let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    let interpreter = resolve(after_env(&words)?)?;
    is_python(&interpreter).then_some(interpreter)
}

/// The program `words` run: the first word, or, when that is `env`, the
/// first word after env's options and settings.
fn after_env(words: &[String]) -> Option<&str> {
    let first = words.first()?;
    if file_name(first) != "env" {
        return Some(first);
    }
    let mut rest = words[1..].iter();
    while let Some(w) = rest.next() {
        match w.as_str() {
            // Options that take a value as the next word.
            "-u" | "--unset" | "-C" | "--chdir" => {
                rest.next();
            }
            "--" => return rest.next().map(String::as_str),
            w if w.starts_with('-') || w.contains('=') => {}
            w => return Some(w),
        }
    }
    None
}

/// `name` as a path: as given when it has a `/` (relative to the current
/// directory), else the first executable of that name on `PATH`.
fn resolve(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        let p = if p.is_absolute() {
            p
        } else {
            std::env::current_dir().ok()?.join(p)
        };
        return p.is_file().then_some(p);
    }
    which(name)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `python`, `python3`, `python3.12`: a CPython's names (a venv's
/// `bin/python` included; the path itself is kept, never its target, so
/// the venv's packages are the ones seen).
fn is_python(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    name.strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The `#!` line of `path` without the `#!`, when it has one.
fn shebang(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 512];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = head.get(..n)?;
    let line = head.strip_prefix(b"#!")?;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let line = std::str::from_utf8(line.get(..end)?).ok()?.trim();
    // `#!/usr/bin/env -S python3 -u`: env's -S splits the rest.
    Some(line.replacen(" -S ", " ", 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn executable(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn the_command_s_python_is_found_directly_after_env_and_through_a_shebang() {
        let dir = tempfile::tempdir().unwrap();
        let py = executable(dir.path(), "python3.12", "");
        let venv_py = executable(dir.path(), "python", "");
        let py_s = py.to_str().unwrap();
        assert_eq!(of_command(&argv(&[py_s, "train.py"])), Some(py.clone()));
        let v = venv_py.to_str().unwrap();
        assert_eq!(
            of_command(&argv(&["/usr/bin/env", "-u", "X", "A=1", v, "x.py"])),
            Some(venv_py.clone())
        );
        let torchrun = executable(dir.path(), "torchrun", &format!("#!{py_s}\nimport sys\n"));
        let t = torchrun.to_str().unwrap();
        assert_eq!(of_command(&argv(&[t, "train.py"])), Some(py.clone()));
        let script = executable(
            dir.path(),
            "train.py",
            &format!("#!/usr/bin/env -S {v} -u\n"),
        );
        let s = script.to_str().unwrap();
        assert_eq!(of_command(&argv(&[s])), Some(venv_py));
        // What a shell script runs is not known.
        let sh = executable(dir.path(), "train.sh", "#!/bin/sh\npython3 x.py\n");
        assert_eq!(of_command(&argv(&[sh.to_str().unwrap()])), None);
        assert_eq!(of_command(&argv(&["/no/such/python3"])), None);
        assert_eq!(Interpreter::for_command(&[]), Interpreter::OnPath);
        assert_eq!(
            Interpreter::for_command(&argv(&[sh.to_str().unwrap()])),
            Interpreter::Unknown
        );
    }

    #[test]
    fn python_names() {
        for yes in ["python", "python3", "/v/bin/python3.12"] {
            assert!(is_python(Path::new(yes)), "{yes}");
        }
        for no in ["pythonw-x", "bash", "python3-config", "ipython"] {
            assert!(!is_python(Path::new(no)), "{no}");
        }
    }
}
