//! What wakes the loop between ticks: the cheap loop's pace, the kernel's
//! v1 thresholds, PSI triggers and `memory.events`, `memory.high`, and
//! the next deadline of all of them.

use super::*;

impl Supervisor {
    /// Hands the cheap loop this tick's limit, levels and working set (and
    /// starts it on the first tick that has a cgroup limit). Not where a
    /// v1 threshold already watches the limit, nor `--without cheap-loop`
    /// (for the tests that prove each wake-up acted).
    pub(super) fn pace_cheap_loop(&mut self, now: Instant) {
        if self.cfg.without.cheap_loop || !self.thresholds.is_empty() {
            return;
        }
        let (Some(reader), Some(sample)) = (&self.sampler.cgroup, &self.core.last_sample) else {
            return;
        };
        let Some(cg) = sample.cgroup.as_ref() else {
            return;
        };
        let (Some(limit), Some(path), Some(ws)) = (
            cg.limit_bytes,
            cg.limit_path.as_deref(),
            cg.limit_working_set_bytes,
        ) else {
            return;
        };
        let levels = cheap::levels(limit, &self.core.wake_levels());
        cheap::CheapLoop::follow(
            &mut self.cheap,
            reader.usage_file(path),
            self.cfg.interval,
            (levels, ws),
            now,
        );
    }

    /// On cgroup v1, asks the kernel to wake us when usage crosses the
    /// warn, critical and last-resort levels of the cgroup ceiling.
    ///
    /// A `--budget` gets the same treatment through the cgroup oomguard
    /// owns (its usage is the job's footprint), so a fast leak cannot race
    /// past the budget between two ticks either.
    pub(super) fn register_thresholds(&mut self, cg: Option<&crate::model::CgroupSample>) {
        if self.cfg.without.usage_threshold {
            return;
        }
        let (Some(reader), Some(cg)) = (&self.sampler.cgroup, cg) else {
            return;
        };
        let mut targets = Vec::new();
        if let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
            && let Some(dir) = reader.limit_dir(path)
        {
            targets.push((dir, limit));
        }
        if let Some(budget) = self.sampler.budget_bytes
            && (reader.owned() || self.attached_exclusive())
            && let Some(dir) = reader.limit_dir(&cg.path)
        {
            targets.push((dir, budget));
        }
        let mut levels = self.core.wake_levels().to_vec();
        levels.dedup();
        for (dir, ceiling) in targets {
            for &h in &levels {
                let bytes = (ceiling as f64 * (1.0 - h / 100.0)) as u64;
                match Threshold::register(&dir, bytes) {
                    Ok(t) => {
                        if let Ok(fd) = watch_threshold(t) {
                            self.thresholds.push(fd);
                        }
                    }
                    Err(e) => {
                        // Not permitted (a user who does not own the
                        // cgroup): said once, and the cheap loop covers it.
                        let why = format!("{}: {e}", dir.join("cgroup.event_control").display());
                        self.wakeup_not_armed("the kernel's usage threshold", &why);
                        self.wakes.usage_threshold.refused = Some(why);
                        return;
                    }
                }
            }
        }
    }

    /// A wake-up that could not be armed, said (and logged) with why: the
    /// run goes on with the others and the tick.
    fn wakeup_not_armed(&mut self, what: &str, why: &str) {
        if !self.cfg.quiet {
            self.say(format!(
                "{what} could not be armed ({why}); polling covers it"
            ));
        }
    }

    /// `run_end.wakeups`: the counts so far, and which were armed.
    pub(super) fn wakeups_armed(&self) -> crate::log::Wakeups {
        let mut w = self.wakes.clone();
        w.usage_threshold.armed = !self.thresholds.is_empty();
        w.psi.armed = self.pri_is_psi.iter().any(|p| *p);
        w.memory_events.armed = self.pri_is_psi.iter().any(|p| !*p);
        w.cheap_loop.armed = self.cheap.is_some();
        w.poll.armed = true;
        w
    }

    /// Kernel wake-ups beyond v1 thresholds: a PSI trigger (200 ms of memory
    /// stall within 2 s) on the job cgroup's `memory.pressure` on v2, or the
    /// machine's `/proc/pressure/memory`; and `memory.events` changes of the
    /// cgroup holding the limit on v2. Best effort: polling covers the rest.
    pub(super) fn register_pri_wakes(&mut self) {
        use crate::probe::cgroup::Version;
        use crate::probe::system::PriWake;
        let v2 = self
            .sampler
            .cgroup
            .as_ref()
            .filter(|c| c.location().version == Version::V2);
        let psi_path = v2
            .map(|c| c.location().dir().join("memory.pressure"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| self.cfg.proc_root.join("pressure/memory"));
        // A 2 s window: what every kernel accepts, also from non-root.
        let mut refused = None;
        if !self.cfg.without.psi {
            match PriWake::psi_trigger(&psi_path, 200_000, 2_000_000) {
                Ok(w) => {
                    if let Some(fd) = watch_pri(w) {
                        self.pri_wakes.push(fd);
                        self.pri_is_psi.push(true);
                    }
                }
                // A kernel without PSI (no file) is not news.
                Err(e) if psi_path.exists() => {
                    refused = Some((format!("the PSI trigger on {}", psi_path.display()), e));
                }
                Err(_) => {}
            }
        }
        if let Some(c) = v2.filter(|_| !self.cfg.without.memory_events) {
            let sample = c.read();
            let limit_dir = sample
                .and_then(|s| s.limit_path)
                .map(|p| c.location().mount_point.join(p.trim_start_matches('/')))
                .unwrap_or_else(|| c.location().dir());
            // The job's own cgroup too: its `high` events (memory.high, set
            // by `set_memory_high`) come the moment it passes that level.
            let mut dirs = vec![limit_dir];
            if c.owned() && !dirs.contains(&c.location().dir()) {
                dirs.push(c.location().dir());
            }
            for dir in dirs {
                if let Ok(w) = PriWake::events(&dir.join("memory.events"))
                    && let Some(fd) = watch_pri(w)
                {
                    self.pri_wakes.push(fd);
                    self.pri_is_psi.push(false);
                }
            }
        }
        if let Some((what, e)) = refused {
            let why = e.to_string();
            self.wakeup_not_armed(&what, &why);
            self.wakes.psi.refused = Some(why);
        }
    }

    /// On cgroup v2, sets `memory.high` of the job's owned cgroup a little
    /// above the critical level (between it and the last-resort level): a
    /// leak that races past the critical level between two ticks is slowed
    /// by the kernel (reclaim and allocation throttling, no kill) while the
    /// graceful stop runs, and the crossing raises a `high` event that
    /// wakes the loop. `--without memory-high` leaves it alone (for
    /// measuring; see docs/design.md).
    /// Sets `memory.high` on oomguard's own v2 cgroup; the value written.
    pub(super) fn set_memory_high(&self, cg: Option<&crate::model::CgroupSample>) -> Option<u64> {
        use crate::probe::cgroup::Version;
        if self.cfg.without.memory_high {
            return None;
        }
        let (Some(reader), Some(cg)) = (&self.sampler.cgroup, cg) else {
            return None;
        };
        if !reader.owned() || reader.location().version != Version::V2 {
            return None;
        }
        let (_, Some(crit)) = self.core.engine.policy().thresholds() else {
            return None;
        };
        // Three quarters of the way from the ceiling down to the critical
        // headroom: 94 % of the ceiling with the default 8 %.
        let share = 1.0 - crit * 0.75 / 100.0;
        let mut high: Option<u64> = None;
        if let (Some(limit), Some(ws)) = (cg.limit_bytes, cg.limit_working_set_bytes) {
            // The ceiling's cgroup also holds oomguard and any siblings.
            let others = ws.saturating_sub(cg.usage_bytes.min(ws));
            let at = (limit as f64 * share) as u64;
            high = Some(at.saturating_sub(others));
        }
        if let Some(budget) = self.sampler.budget_bytes {
            let at = (budget as f64 * share) as u64;
            high = Some(high.map_or(at, |h| h.min(at)));
        }
        let high = high.filter(|h| *h > 0)?;
        // Best effort: without it the wake-ups and polling still act.
        std::fs::write(
            reader.location().dir().join("memory.high"),
            high.to_string(),
        )
        .ok()
        .map(|()| high)
    }

    pub(super) fn next_wake(&self) -> Instant {
        let mut wake = self.next_tick;
        if let Some(k) = self.core.act.kill_deadline() {
            wake = wake.min(k);
        }
        if self.main_status.is_some() {
            wake = wake.min(crate::clock::now() + Duration::from_millis(50));
        }
        if let Some(d) = self.hooks.next_deadline() {
            wake = wake.min(d);
        }
        if let Some(r) = self.attempts.relaunch_at() {
            wake = r;
        }
        if let Some(w) = self.watch_deadline() {
            wake = wake.min(w);
        }
        if let Some(c) = self.cheap.as_ref().and_then(cheap::CheapLoop::due) {
            wake = wake.min(c);
        }
        wake
    }
}
