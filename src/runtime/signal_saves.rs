//! What oomguard does with a signal that asks for a save (`--on-signal`),
//! once `signals.rs` has decided: the save and exit within the signal
//! budget, the save a running stop already serves, and a USR1 or USR2
//! passed on without a companion, never to a process it would kill.

use std::os::fd::AsFd;

use super::Supervisor;
use super::act::{self, Ident, SIG_TERM};
use crate::engine::policy::Action;
use crate::job::supervise;
use crate::vocab::units::human_duration;

impl Supervisor {
    /// A signal that asks for a save (`--on-signal`): with `exit`, every
    /// rank saves the step it completed and the job ends within
    /// `--signal-budget`; otherwise training goes on after the save.
    pub(super) fn save_for_signal(&mut self, sig: i32, exit: bool) {
        let name = supervise::signal_name(sig);
        self.signal_save(sig, exit, &format!("{name} received"));
    }

    /// [`Supervisor::save_for_signal`], said as `what` ("SIGTERM
    /// received", "Ctrl-C").
    pub(super) fn signal_save(&mut self, sig: i32, exit: bool, name: &str) {
        let now = crate::vocab::clock::now();
        if !exit {
            self.core.act_mut().request(Action::Checkpoint, name, now);
            if !self.cfg.quiet {
                self.say(format!(
                    "{name}: every rank saves its last step; training goes on"
                ));
            }
            self.acted(None);
            return;
        }
        if self.child.foreground() {
            supervise::reclaim_foreground(std::io::stdin().as_fd());
            self.child.left_foreground();
        }
        self.refresh_tree();
        let budget = self.save_budget();
        let at = (self.sampler.tree(), self.child.pid());
        (self.core).begin_signal_save((sig, name), budget, at, now, self.child.sig_mut());
        if sig == libc::SIGINT {
            // A second interrupt means now.
            self.child.shutting_down(sig);
        }
        if !self.cfg.quiet {
            let again = if sig == libc::SIGINT {
                " (Ctrl-C again to interrupt now)"
            } else {
                ""
            };
            self.say(format!(
                "{name}: saving at the next step, then stopping within {}{again}",
                human_duration(self.cfg.signal_budget)
            ));
        }
        self.acted(None);
    }

    /// A signal asking for a save came while one is under way: that save
    /// serves it, and its deadline holds (or comes closer, for a stop of
    /// oomguard's own that had longer). An interrupt is remembered: the
    /// next one kills.
    pub(super) fn already_saving(&mut self, sig: i32) {
        let budget = self.save_budget();
        self.core
            .act_mut()
            .hurry_save(budget, crate::vocab::clock::now());
        self.core.act_mut().served_signal(sig);
        if sig == libc::SIGINT {
            self.child.shutting_down(sig);
        }
        if !self.cfg.quiet {
            self.say(format!(
                "{} received: the save under way already ends the job",
                supervise::signal_name(sig)
            ));
        }
    }

    /// `--signal-budget`, and the `--kill-after` it ends with.
    fn save_budget(&self) -> act::SaveBudget {
        act::SaveBudget {
            total: self.cfg.signal_budget,
            kill_after: self.cfg.kill_after,
        }
    }

    /// USR1 or USR2 passed on as a terminal would (to the job's process
    /// group), except that a process that neither catches nor ignores it
    /// gets SIGTERM instead: USR1's default action kills, with no save and
    /// a cause nobody would guess (torchrun dies of it). The log's `stop`
    /// line names who got which. `asks_save`: `--on-signal` maps it to a
    /// save and exit, which no companion could make.
    pub(super) fn forward_user_signal(&mut self, sig: i32, asks_save: bool) {
        self.refresh_tree();
        let group = self.child.pid() as i32;
        let members: Vec<Ident> = self
            .sampler
            .tree()
            .iter()
            .filter(|p| {
                p.pid == self.child.pid()
                    || process_group(&self.cfg.proc_root, p.pid) == Some(group)
            })
            .map(|p| (p.pid, p.start_time))
            .collect();
        let (takers, deaf): (Vec<Ident>, Vec<Ident>) = members
            .iter()
            .partition(|id| self.child.sig().takes(**id, sig) != Some(false));
        let (got, _) = self.signal_all(&takers, sig);
        if deaf.is_empty() {
            return;
        }
        let name = supervise::signal_name(sig);
        let list = |p: &[u32]| p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let deaf_pids: Vec<u32> = deaf.iter().map(|d| d.0).collect();
        let to_takers = if got.is_empty() {
            String::new()
        } else {
            format!("; {name} to pid {}", list(&got))
        };
        let why = format!(
            "{name} received: pid {} neither catches nor ignores it, so SIGTERM instead{to_takers}",
            list(&deaf_pids)
        );
        let (pids, result) = self.signal_all(&deaf, SIG_TERM);
        self.say(why.clone());
        self.begin_shutdown(&why, pids, SIG_TERM, result);
        // The warning asked for a save, and the SIGTERM that stands in for
        // it ends the job: when it has ended, the run ends with the stop
        // code all the same, so that the warned job is requeued, not lost
        // to the time limit that follows. (A job whose processes all catch
        // the signal handles the warning itself, and its exit stands.)
        if asks_save {
            let not_saved = format!(
                "no companion had spoken, so {name} was passed on to the job, as SIGTERM to pid {} that would have died of it",
                list(&deaf_pids)
            );
            self.core.act_mut().end_unsaved(sig, not_saved);
        }
    }
}

/// The process group of `pid` (from its `stat`), while it runs.
fn process_group(proc_root: &std::path::Path, pid: u32) -> Option<i32> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    crate::engine::probe::proc::parse_stat(&text).map(|st| st.pgrp)
}
