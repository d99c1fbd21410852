//! The way into the loop: `run` (and the doctor's `judge`) build the
//! tokio runtime, run the supervisor on it, and turn a panic anywhere in
//! it into exit 70 with the log closed, never a lost run.

use super::{EXIT_INTERNAL, setup};
use crate::settings::Settings;

/// Runs the job under supervision and returns oomguard's exit code.
pub fn run(cfg: Settings) -> i32 {
    run_watched(cfg, None)
}

/// `oomguard doctor -- CMD`: runs the job until it can be judged (see
/// `cfg.doctor`), and returns the exit code with what was found.
pub fn judge(cfg: Settings) -> (i32, Option<crate::vocab::verdict::Finding>) {
    let watch = crate::vocab::verdict::Watch::new(cfg.doctor.unwrap_or_default());
    let code = run_watched(cfg, Some(watch.clone()));
    (code, watch.finding())
}

fn run_watched(cfg: Settings, doctor: Option<crate::vocab::verdict::Watch>) -> i32 {
    let log = cfg.log.clone();
    let started = crate::vocab::clock::now();
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match build_runtime() {
            Ok(rt) => rt.block_on(setup::supervise_job(cfg, doctor)),
            Err(e) => {
                eprintln!("oomguard: cannot start the runtime: {e}");
                EXIT_INTERNAL
            }
        }));
    match outcome {
        Ok(code) => code,
        Err(payload) => {
            let what = panic_text(payload.as_ref());
            eprintln!("oomguard: internal error: {what}");
            if let Some(path) = log {
                crate::sinks::log::end_after_failure(
                    &path,
                    started,
                    &format!("oomguard panicked: {what}"),
                );
            }
            EXIT_INTERNAL
        }
    }
}

/// The loop's runtime. With almost no file descriptors left, tokio's
/// signal driver panics instead of failing: that panic becomes the error
/// it stands for, and the report meant for bugs (location, backtrace) is
/// not printed. oomguard has no other thread yet, so swapping the panic
/// hook for this moment silences nothing else.
fn build_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    });
    std::panic::set_hook(hook);
    built.unwrap_or_else(|payload| Err(std::io::Error::other(panic_text(payload.as_ref()))))
}

/// What a panic said.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}
