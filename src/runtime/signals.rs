//! What a signal oomguard receives, or its dashboard's hangup, means for the
//! run: a pure decision on where the run stands, so the loop's answers
//! (a scheduler's TERM or USR1 becomes a save every rank agrees on, a
//! second TERM during that save changes nothing, a second Ctrl-C kills, an
//! interrupt between attempts cancels the restart, a watcher never
//! forwards) are tested without a process. The loop carries the decision
//! out.

use crate::settings::values::{SignalAction, SignalMap};

/// The forwarded signals: (signal, whether it starts oomguard's shutdown:
/// the `--kill-after` clock). HUP and QUIT are only passed on; a job may
/// handle them and go on.
pub(super) const FORWARDED: [(i32, bool); 6] = [
    (libc::SIGINT, true),
    (libc::SIGTERM, true),
    (libc::SIGHUP, false),
    (libc::SIGQUIT, false),
    (libc::SIGUSR1, false),
    (libc::SIGUSR2, false),
];

/// Where the run stands when a signal arrives.
#[derive(Debug, Clone, Copy)]
pub(super) struct Standing {
    /// The target takes signals from oomguard (a launched job).
    pub forwards: bool,
    /// No job is running: the next attempt is waiting to start.
    pub between_attempts: bool,
    /// The INT or TERM that already started the shutdown.
    pub shutdown_signal: Option<i32>,
    /// A companion answers: the ranks can be asked to save.
    pub companion: bool,
    /// A save and exit is under way (a signal's, or oomguard's own stop):
    /// it serves a signal that asks for one too.
    pub saving: bool,
}

/// What the loop does with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SignalPlan {
    /// Nothing: a signal a watcher does not pass on, or one with no job
    /// to go to.
    Ignore,
    /// INT or TERM under `attach`: the watch ends, the job runs on.
    EndWatch,
    /// INT, TERM or HUP between attempts: the restart is cancelled.
    CancelRestart,
    /// The same INT or TERM again while the job stops: the user means now.
    Kill,
    /// Passed on to the job; INT and TERM also start the shutdown (a paused
    /// job is let run, and `--kill-after` counts).
    Forward { starts_shutdown: bool },
    /// Every rank is asked to save the step it completed; `exit`: then the
    /// job ends (within `--signal-budget`), else training goes on.
    Save { exit: bool },
    /// A save and exit is already under way and serves this signal too:
    /// nothing changes, and its deadline holds.
    AlreadySaving,
}

/// Whether `sig` ends the run when the job ends on it (INT, TERM).
pub(super) fn ends_the_run(sig: i32) -> bool {
    FORWARDED.iter().any(|&(s, ends)| s == sig && ends)
}

pub(super) fn plan(sig: i32, at: Standing, map: &SignalMap) -> SignalPlan {
    let ends = ends_the_run(sig);
    if !at.forwards {
        return if ends {
            SignalPlan::EndWatch
        } else {
            SignalPlan::Ignore
        };
    }
    if at.between_attempts {
        // A HUP (the terminal went away) would have reached a running job;
        // with none running, the restart it would have started is off.
        return if ends || sig == libc::SIGHUP {
            SignalPlan::CancelRestart
        } else {
            SignalPlan::Ignore
        };
    }
    // The same INT or TERM again, after it was passed on (or, for an
    // interrupt, after it asked for a save): the user means now.
    if ends && at.shutdown_signal == Some(sig) {
        return SignalPlan::Kill;
    }
    let action = map.get(sig);
    if at.saving && action == Some(SignalAction::CheckpointAndExit) {
        return SignalPlan::AlreadySaving;
    }
    match action {
        Some(SignalAction::CheckpointAndExit) if at.companion => SignalPlan::Save { exit: true },
        Some(SignalAction::Checkpoint) if at.companion => SignalPlan::Save { exit: false },
        _ => SignalPlan::Forward {
            starts_shutdown: ends,
        },
    }
}

/// What the loop does when the dashboard's terminal hangs up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HangupPlan {
    /// `--on-hangup detach`: supervision goes on without a dashboard.
    GoOnHeadless,
    /// A watcher: the watch ends as on SIGTERM.
    EndWatch,
    /// Between attempts: no job to hang up on; the restart is cancelled.
    CancelRestart,
    /// As for a job run from a shell: the job gets SIGHUP and the run ends
    /// (`--kill-after` for a tree that outlives it).
    HangUpTheJob,
}

pub(super) fn hangup_plan(go_on: bool, at: Standing) -> HangupPlan {
    if go_on {
        HangupPlan::GoOnHeadless
    } else if !at.forwards {
        HangupPlan::EndWatch
    } else if at.between_attempts {
        HangupPlan::CancelRestart
    } else {
        HangupPlan::HangUpTheJob
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: Standing = Standing {
        forwards: true,
        between_attempts: false,
        shutdown_signal: None,
        companion: false,
        saving: false,
    };

    fn plan(sig: i32, at: Standing) -> SignalPlan {
        super::plan(sig, at, &SignalMap::default())
    }

    #[test]
    fn with_a_companion_a_schedulers_signal_asks_every_rank_to_save() {
        let with = Standing {
            companion: true,
            ..RUNNING
        };
        for sig in [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2, libc::SIGINT] {
            assert_eq!(plan(sig, with), SignalPlan::Save { exit: true }, "{sig}");
        }
        // HUP and QUIT have no save: passed on as before.
        assert_eq!(
            plan(libc::SIGHUP, with),
            SignalPlan::Forward {
                starts_shutdown: false
            }
        );
        let map = crate::settings::values::signal_map("USR1=checkpoint,USR2=forward").unwrap();
        assert_eq!(
            super::plan(libc::SIGUSR1, with, &map),
            SignalPlan::Save { exit: false }
        );
        assert_eq!(
            super::plan(libc::SIGUSR2, with, &map),
            SignalPlan::Forward {
                starts_shutdown: false
            }
        );
    }

    #[test]
    fn a_second_signal_during_the_save_changes_nothing_but_a_second_interrupt_kills() {
        let saving = Standing {
            companion: true,
            saving: true,
            ..RUNNING
        };
        for sig in [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2, libc::SIGINT] {
            assert_eq!(plan(sig, saving), SignalPlan::AlreadySaving, "{sig}");
        }
        // The loop remembers an interrupt that asked for (or joined) a
        // save: the next one kills at once.
        let interrupted = Standing {
            shutdown_signal: Some(libc::SIGINT),
            ..saving
        };
        assert_eq!(plan(libc::SIGINT, interrupted), SignalPlan::Kill);
        assert_eq!(plan(libc::SIGTERM, interrupted), SignalPlan::AlreadySaving);
    }

    #[test]
    fn without_a_companion_signals_are_passed_on_as_before() {
        assert_eq!(
            plan(libc::SIGTERM, RUNNING),
            SignalPlan::Forward {
                starts_shutdown: true
            }
        );
        assert_eq!(
            plan(libc::SIGUSR1, RUNNING),
            SignalPlan::Forward {
                starts_shutdown: false
            }
        );
    }

    #[test]
    fn a_second_ctrl_c_kills_and_a_first_is_passed_on() {
        assert_eq!(
            plan(libc::SIGINT, RUNNING),
            SignalPlan::Forward {
                starts_shutdown: true
            }
        );
        let stopping = Standing {
            shutdown_signal: Some(libc::SIGINT),
            ..RUNNING
        };
        assert_eq!(plan(libc::SIGINT, stopping), SignalPlan::Kill);
        // A TERM after the Ctrl-C is another request, passed on.
        assert_eq!(
            plan(libc::SIGTERM, stopping),
            SignalPlan::Forward {
                starts_shutdown: true
            }
        );
        // HUP and USR1 never start the shutdown, whatever came before.
        assert_eq!(
            plan(libc::SIGUSR1, stopping),
            SignalPlan::Forward {
                starts_shutdown: false
            }
        );
    }

    #[test]
    fn an_interrupt_or_a_hangup_between_attempts_cancels_the_restart() {
        let between = Standing {
            between_attempts: true,
            ..RUNNING
        };
        assert_eq!(plan(libc::SIGINT, between), SignalPlan::CancelRestart);
        assert_eq!(plan(libc::SIGTERM, between), SignalPlan::CancelRestart);
        assert_eq!(plan(libc::SIGHUP, between), SignalPlan::CancelRestart);
        // Nothing to pass a USR1 to, and it does not end the run.
        assert_eq!(plan(libc::SIGUSR1, between), SignalPlan::Ignore);
        assert_eq!(hangup_plan(false, between), HangupPlan::CancelRestart);
        assert_eq!(hangup_plan(true, between), HangupPlan::GoOnHeadless);
    }

    #[test]
    fn a_watcher_never_forwards_and_ends_its_watch_on_int_term_or_hangup() {
        let watching = Standing {
            forwards: false,
            ..RUNNING
        };
        assert_eq!(plan(libc::SIGINT, watching), SignalPlan::EndWatch);
        assert_eq!(plan(libc::SIGTERM, watching), SignalPlan::EndWatch);
        for sig in [libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
            assert_eq!(plan(sig, watching), SignalPlan::Ignore, "{sig}");
        }
        assert_eq!(hangup_plan(false, watching), HangupPlan::EndWatch);
    }

    #[test]
    fn a_hangup_reaches_a_running_job_unless_told_to_go_on() {
        assert_eq!(hangup_plan(false, RUNNING), HangupPlan::HangUpTheJob);
        assert_eq!(hangup_plan(true, RUNNING), HangupPlan::GoOnHeadless);
    }
}
