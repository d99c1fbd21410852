//! The dashboard's state: everything the supervision loop feeds in
//! (samples, events, output, policy state) and what the user did (focus,
//! scroll, sort, overlays). No terminal and no clock here: time arrives
//! with the samples and events, keys arrive as `KeyEvent`s, and what the
//! user asked for leaves as a `UiCommand` the loop acts on.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::vocab::model::{CeilingSource, Role, Sample, View};

use super::event::describe;
pub use super::event::{ActionKind, EventLine, Severity, UiEvent};
use super::growth::{Growth, has_children};
use super::output::OutputBuffer;

/// Seconds of history the memory chart shows.
pub const CHART_WINDOW_SECONDS: f64 = 600.0;
/// Points the chart keeps at most; samples closer together are merged
/// (keeping the maximum, so short peaks stay visible).
const CHART_MAX_POINTS: usize = 300;
/// Events kept in the events pane.
const MAX_EVENTS: usize = 1000;
/// Page size before the first render told us the real one.
const DEFAULT_PAGE: usize = 10;

/// Every key the dashboard understands, as the help overlay (and the
/// README) lists them: (keys, what they do).
pub const KEYS: &[(&str, &str)] = &[
    (
        "q",
        "quit: asks whether to stop the job or leave it running",
    ),
    ("p", "pause / resume the job"),
    ("s", "stop the job gracefully (asks first)"),
    ("r", "restart the job (asks first)"),
    (
        "Ctrl-C",
        "interrupt the job (SIGINT), as in its own terminal",
    ),
    (
        "Tab / Shift-Tab",
        "next / previous pane: processes, output, events",
    ),
    ("↑ ↓  k j", "scroll the pane; select a process"),
    ("PgUp PgDn", "scroll a page"),
    ("Home End", "top / bottom (End follows new lines)"),
    ("Esc", "close a dialog; clear the selected process"),
    ("t", "sort processes as a tree (default)"),
    ("n  c", "sort by pid, command"),
    ("m  e  u", "sort by PSS, RSS, USS"),
    ("w  v  g", "sort by swap, GPU memory, growth"),
    ("", "the same sort key again reverses the order"),
    ("?  h  F1", "this help"),
];

/// What the supervision loop is doing about the job, as the header shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyState {
    /// Nothing to do.
    #[default]
    Normal,
    /// A rule fired with a warning.
    Warning,
    /// The tree is paused (SIGSTOP / frozen).
    Paused,
    /// A graceful stop is under way.
    Stopping,
    /// The job is being restarted.
    Restarting,
}

impl PolicyState {
    /// The label the header shows.
    pub fn label(self) -> &'static str {
        match self {
            PolicyState::Normal => "NORMAL",
            PolicyState::Warning => "WARNING",
            PolicyState::Paused => "PAUSED",
            PolicyState::Stopping => "STOPPING",
            PolicyState::Restarting => "RESTARTING",
        }
    }
}

/// What the user asked for; the loop carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UiCommand {
    /// Leave the dashboard; stop the job first, or leave it running.
    Quit { stop_job: bool },
    /// Pause the job if it runs, resume it if it is paused.
    TogglePause,
    /// Stop the job gracefully (confirmed by the user).
    Stop,
    /// Restart the job (confirmed; only offered when available).
    Restart,
    /// Ctrl-C: forward an interrupt (SIGINT) to the job.
    Interrupt,
}

/// The focusable panes, in `Tab` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pane {
    #[default]
    Processes,
    Output,
    Events,
}

impl Pane {
    fn next(self) -> Self {
        match self {
            Pane::Processes => Pane::Output,
            Pane::Output => Pane::Events,
            Pane::Events => Pane::Processes,
        }
    }

    fn prev(self) -> Self {
        match self {
            Pane::Processes => Pane::Events,
            Pane::Output => Pane::Processes,
            Pane::Events => Pane::Output,
        }
    }
}

/// Process table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Parents before children, as the tree is (indented).
    #[default]
    Tree,
    Pid,
    Comm,
    Pss,
    Rss,
    Uss,
    Swap,
    Gpu,
    Growth,
}

impl SortKey {
    /// The key that selects this order (see the help overlay).
    pub fn key(self) -> char {
        match self {
            SortKey::Tree => 't',
            SortKey::Pid => 'n',
            SortKey::Comm => 'c',
            SortKey::Pss => 'm',
            SortKey::Rss => 'e',
            SortKey::Uss => 'u',
            SortKey::Swap => 'w',
            SortKey::Gpu => 'v',
            SortKey::Growth => 'g',
        }
    }

    fn from_key(c: char) -> Option<Self> {
        [
            SortKey::Tree,
            SortKey::Pid,
            SortKey::Comm,
            SortKey::Pss,
            SortKey::Rss,
            SortKey::Uss,
            SortKey::Swap,
            SortKey::Gpu,
            SortKey::Growth,
        ]
        .into_iter()
        .find(|k| k.key() == c)
    }

    /// Sizes and growth read best largest first; names and pids ascending.
    fn descending_by_default(self) -> bool {
        !matches!(self, SortKey::Tree | SortKey::Pid | SortKey::Comm)
    }
}

/// A modal or overlay on top of the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlay {
    #[default]
    None,
    Help,
    /// `q`: stop the job, detach, or cancel.
    Quit,
    /// `s`: confirm the graceful stop.
    ConfirmStop,
    /// `r`: confirm the restart.
    ConfirmRestart,
}

/// PyTorch allocator figures of one process on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TorchMem {
    pub device: u32,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// One remembered tick of the chart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChartPoint {
    pub t: f64,
    /// What the policy holds against the ceilings (`footprint::of`).
    pub footprint: u64,
    pub pss: u64,
    pub rss: u64,
    pub swap: u64,
    /// (source, limit, used) of every ceiling.
    pub ceilings: Vec<(CeilingSource, u64, u64)>,
    /// (device index, used bytes, total bytes).
    pub gpus: Vec<(u32, u64, u64)>,
}

impl ChartPoint {
    fn merge_max(&mut self, o: ChartPoint) {
        self.t = o.t;
        self.footprint = self.footprint.max(o.footprint);
        self.pss = self.pss.max(o.pss);
        self.rss = self.rss.max(o.rss);
        self.swap = self.swap.max(o.swap);
        for (src, limit, used) in o.ceilings {
            match self.ceilings.iter_mut().find(|c| c.0 == src) {
                Some(c) => {
                    c.1 = limit;
                    c.2 = c.2.max(used);
                }
                None => self.ceilings.push((src, limit, used)),
            }
        }
        for (dev, used, total) in o.gpus {
            match self.gpus.iter_mut().find(|g| g.0 == dev) {
                Some(g) => {
                    g.1 = g.1.max(used);
                    g.2 = total;
                }
                None => self.gpus.push((dev, used, total)),
            }
        }
    }
}

/// What the last render learned about pane sizes, so paging moves by a
/// real page and the table keeps its scroll position between frames.
#[derive(Debug, Default)]
pub(crate) struct Viewport {
    pub table_rows: Cell<usize>,
    pub table_offset: Cell<usize>,
    pub output_rows: Cell<usize>,
    pub events_rows: Cell<usize>,
}

/// One row of the process table, already computed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProcRow {
    pub pid: u32,
    pub role: Role,
    pub comm: String,
    pub depth: usize,
    pub rss: u64,
    pub pss: u64,
    pub uss: u64,
    pub swap: u64,
    pub gpu: Option<u64>,
    /// Bytes per minute, of the process's family when it has children
    /// (see `growth`).
    pub growth: crate::vocab::growth::Figure,
    /// Whether the process has children, so `growth` is its family's.
    pub family: bool,
}

/// The dashboard state.
#[derive(Debug)]
pub struct App {
    pub(crate) command: String,
    pub(crate) attempt: u32,
    /// Training progress the job printed, for the header.
    pub(crate) progress: Option<crate::vocab::forensics::progress::Progress>,
    pub(crate) elapsed: f64,
    pub(crate) policy: PolicyState,
    pub(crate) warn_percent: Option<f64>,
    pub(crate) critical_percent: Option<f64>,
    pub(crate) restart_available: bool,
    pub(crate) sample: Option<Sample>,
    pub(crate) view: Option<View>,
    pub(crate) chart: VecDeque<ChartPoint>,
    growth: Growth,
    pub(crate) torch: BTreeMap<u32, Vec<TorchMem>>,
    pub(crate) events: VecDeque<EventLine>,
    pub(crate) output: OutputBuffer,
    pub(crate) focus: Pane,
    pub(crate) sort: SortKey,
    pub(crate) sort_reverse: bool,
    pub(crate) selected: Option<u32>,
    /// Lines scrolled up from the bottom (0 = following new lines).
    pub(crate) output_scroll: usize,
    pub(crate) events_scroll: usize,
    pub(crate) overlay: Overlay,
    pub(crate) flash: Option<String>,
    pub(crate) viewport: Viewport,
}

impl App {
    /// A dashboard for `command` (shown in the header as given), attempt 1.
    pub fn new(command: String) -> Self {
        Self {
            command,
            attempt: 1,
            progress: None,
            elapsed: 0.0,
            policy: PolicyState::Normal,
            warn_percent: None,
            critical_percent: None,
            restart_available: false,
            sample: None,
            view: None,
            chart: VecDeque::new(),
            growth: Growth::default(),
            torch: BTreeMap::new(),
            events: VecDeque::new(),
            output: OutputBuffer::default(),
            focus: Pane::default(),
            sort: SortKey::default(),
            sort_reverse: false,
            selected: None,
            output_scroll: 0,
            events_scroll: 0,
            overlay: Overlay::None,
            flash: None,
            viewport: Viewport::default(),
        }
    }

    /// A new tick: the latest readings, the chart and the growth column.
    pub fn on_sample(&mut self, sample: &Sample, view: &View) {
        self.elapsed = sample.t;
        let point = ChartPoint {
            t: sample.t,
            footprint: super::footprint::of(sample).0,
            pss: sample.tree.pss_bytes,
            rss: sample.tree.rss_bytes,
            swap: sample.tree.swap_bytes,
            ceilings: sample
                .ceilings()
                .iter()
                .map(|c| (c.ceiling.source, c.ceiling.bytes, c.used_bytes))
                .collect(),
            gpus: sample
                .gpus
                .iter()
                .map(|g| (g.index, g.used_bytes, g.total_bytes))
                .collect(),
        };
        if self.chart.back().is_some_and(|p| sample.t < p.t) {
            // Time went backwards: a new attempt with its own clock.
            self.chart.clear();
        }
        let bucket = CHART_WINDOW_SECONDS / CHART_MAX_POINTS as f64;
        // The run's first sample keeps a point of its own: the axis starts
        // there, and a merged first point would start the lines a bucket in.
        let first_only = self.chart.len() == 1;
        match self.chart.back_mut() {
            Some(last)
                if !first_only && (last.t / bucket).floor() == (sample.t / bucket).floor() =>
            {
                last.merge_max(point)
            }
            _ => self.chart.push_back(point),
        }
        // One point at or past the window's edge stays, so that the lines
        // reach the left of the axis once the run is longer than it.
        while self
            .chart
            .get(1)
            .is_some_and(|p| sample.t - p.t >= CHART_WINDOW_SECONDS)
        {
            self.chart.pop_front();
        }
        self.growth.push(sample);
        self.torch
            .retain(|pid, _| sample.procs.iter().any(|p| p.pid == *pid));
        self.sample = Some(sample.clone());
        self.view = Some(view.clone());
    }

    /// Something happened: it goes to the events pane.
    pub fn on_event(&mut self, ev: UiEvent) {
        let line = describe(&ev);
        self.elapsed = self.elapsed.max(line.t);
        if self.events_scroll > 0 {
            // Keep a scrolled-up view where it is.
            self.events_scroll += 1;
        }
        self.events.push_back(line);
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
        self.events_scroll = self.events_scroll.min(self.events.len().saturating_sub(1));
    }

    /// Output from the job's terminal, as raw bytes.
    pub fn on_output(&mut self, bytes: &[u8]) {
        let before = self.output.total_lines();
        self.output.feed(bytes);
        if self.output_scroll > 0 {
            let added = (self.output.total_lines() - before) as usize;
            self.output_scroll =
                (self.output_scroll + added).min(self.output.len().saturating_sub(1));
        }
    }

    /// PyTorch allocator stats of one process: (device, allocated bytes,
    /// reserved bytes). Forgotten when the process leaves the tree.
    pub fn on_torch(&mut self, pid: u32, devices: Vec<(u32, u64, u64)>) {
        self.torch.insert(
            pid,
            devices
                .into_iter()
                .map(|(device, allocated_bytes, reserved_bytes)| TorchMem {
                    device,
                    allocated_bytes,
                    reserved_bytes,
                })
                .collect(),
        );
    }

    /// What the supervision loop is doing.
    pub fn set_policy_state(&mut self, state: PolicyState) {
        self.policy = state;
    }

    /// Headroom percentages at which the policy warns and acts; drawn as
    /// marks on the gauges and lines on the chart.
    pub fn set_thresholds(
        &mut self,
        warn_headroom_percent: Option<f64>,
        critical_headroom_percent: Option<f64>,
    ) {
        self.warn_percent = warn_headroom_percent.filter(|p| p.is_finite());
        self.critical_percent = critical_headroom_percent.filter(|p| p.is_finite());
    }

    /// The attempt number shown in the header (1-based).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }

    /// The job's training progress, shown in the header.
    pub fn set_progress(&mut self, progress: Option<crate::vocab::forensics::progress::Progress>) {
        self.progress = progress;
    }

    /// Whether `r` offers a restart.
    pub fn set_restart_available(&mut self, available: bool) {
        self.restart_available = available;
    }

    /// Seconds since the run started, for when time passes without samples.
    pub fn set_elapsed(&mut self, seconds: f64) {
        self.elapsed = seconds;
    }

    /// The overlay currently shown.
    pub fn overlay(&self) -> Overlay {
        self.overlay
    }

    /// The focused pane.
    pub fn focus(&self) -> Pane {
        self.focus
    }

    /// The process table order and whether it is reversed.
    pub fn sort(&self) -> (SortKey, bool) {
        (self.sort, self.sort_reverse)
    }

    /// The job's output so far.
    pub fn output(&self) -> &OutputBuffer {
        &self.output
    }

    /// Events so far, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &EventLine> {
        self.events.iter()
    }

    /// A key press. Returns what the loop should do, if anything; the
    /// dashboard should be redrawn after every key either way.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<UiCommand> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c' | 'C')) {
            // In raw mode ^C is a key, not a signal: pass it on to the job.
            return Some(UiCommand::Interrupt);
        }
        if ctrl && matches!(key.code, KeyCode::Char('l' | 'L')) {
            // The loop redraws after every key anyway.
            return None;
        }
        self.flash = None;
        match self.overlay {
            Overlay::Help => {
                if matches!(
                    key.code,
                    KeyCode::Esc | KeyCode::Enter | KeyCode::Char('?' | 'q' | 'h')
                ) {
                    self.overlay = Overlay::None;
                }
                None
            }
            Overlay::Quit => match key.code {
                KeyCode::Char('s' | 'S' | 'y' | 'Y') => {
                    self.overlay = Overlay::None;
                    Some(UiCommand::Quit { stop_job: true })
                }
                KeyCode::Char('d' | 'D') => {
                    self.overlay = Overlay::None;
                    Some(UiCommand::Quit { stop_job: false })
                }
                KeyCode::Esc | KeyCode::Char('c' | 'C' | 'n' | 'N' | 'q') => {
                    self.overlay = Overlay::None;
                    None
                }
                _ => None,
            },
            Overlay::ConfirmStop | Overlay::ConfirmRestart => {
                let cmd = if self.overlay == Overlay::ConfirmStop {
                    UiCommand::Stop
                } else {
                    UiCommand::Restart
                };
                match key.code {
                    KeyCode::Char('y' | 'Y') | KeyCode::Enter => {
                        self.overlay = Overlay::None;
                        Some(cmd)
                    }
                    KeyCode::Esc | KeyCode::Char('n' | 'N' | 'q') => {
                        self.overlay = Overlay::None;
                        None
                    }
                    _ => None,
                }
            }
            Overlay::None => self.normal_key(key),
        }
    }

    fn normal_key(&mut self, key: KeyEvent) -> Option<UiCommand> {
        match key.code {
            KeyCode::Char('q') => self.overlay = Overlay::Quit,
            KeyCode::Char('?' | 'h') | KeyCode::F(1) => self.overlay = Overlay::Help,
            KeyCode::Char('p' | 'P') => return Some(UiCommand::TogglePause),
            KeyCode::Char('s' | 'S') => self.overlay = Overlay::ConfirmStop,
            KeyCode::Char('r' | 'R') => {
                if self.restart_available {
                    self.overlay = Overlay::ConfirmRestart;
                } else {
                    self.flash = Some("restart is not configured for this run".into());
                }
            }
            KeyCode::Tab => self.focus = self.focus.next(),
            KeyCode::BackTab => self.focus = self.focus.prev(),
            KeyCode::Up | KeyCode::Char('k') => self.scroll(-1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll(1),
            KeyCode::PageUp => self.scroll(-(self.page() as isize)),
            KeyCode::PageDown => self.scroll(self.page() as isize),
            KeyCode::Home => self.scroll(isize::MIN),
            KeyCode::End => self.scroll(isize::MAX),
            KeyCode::Esc => self.selected = None,
            KeyCode::Char(c) => {
                if let Some(k) = SortKey::from_key(c) {
                    if self.sort == k {
                        self.sort_reverse = !self.sort_reverse;
                    } else {
                        self.sort = k;
                        self.sort_reverse = false;
                    }
                }
            }
            _ => {}
        }
        None
    }

    fn page(&self) -> usize {
        let rows = match self.focus {
            Pane::Processes => self.viewport.table_rows.get(),
            Pane::Output => self.viewport.output_rows.get(),
            Pane::Events => self.viewport.events_rows.get(),
        };
        if rows == 0 {
            DEFAULT_PAGE
        } else {
            rows.saturating_sub(1).max(1)
        }
    }

    /// Moves the focused pane by `delta` rows (down is positive);
    /// `isize::MIN`/`MAX` go to the top/bottom.
    fn scroll(&mut self, delta: isize) {
        match self.focus {
            Pane::Processes => {
                let rows = self.proc_rows();
                if rows.is_empty() {
                    return;
                }
                let cur = self
                    .selected
                    .and_then(|pid| rows.iter().position(|r| r.pid == pid));
                let next = match (cur, delta) {
                    (_, isize::MIN) => 0,
                    (_, isize::MAX) => rows.len() - 1,
                    (None, _) => 0,
                    (Some(i), d) => i.saturating_add_signed(d).min(rows.len() - 1),
                };
                self.selected = Some(rows[next].pid);
            }
            Pane::Output => {
                let max = self
                    .output
                    .len()
                    .saturating_sub(self.viewport.output_rows.get().max(1));
                self.output_scroll = scroll_from_bottom(self.output_scroll, delta, max);
            }
            Pane::Events => {
                let max = self
                    .events
                    .len()
                    .saturating_sub(self.viewport.events_rows.get().max(1));
                self.events_scroll = scroll_from_bottom(self.events_scroll, delta, max);
            }
        }
    }

    /// The process table's rows in display order.
    /// The growth column's figure for a process (its family's PSS,
    /// bytes/s).
    pub(crate) fn growth(&self, pid: u32, start_time: u64) -> crate::vocab::growth::Figure {
        self.growth.figure(pid, start_time)
    }

    pub(crate) fn proc_rows(&self) -> Vec<ProcRow> {
        let Some(sample) = &self.sample else {
            return Vec::new();
        };
        let depth = tree_order(sample);
        let parents = has_children(sample);
        // A tree being torn down holds no pages: the sweeper's PSS and USS
        // estimates of it are stale, and beside an RSS of 0 they would
        // contradict it.
        let held = |bytes: u64| {
            if super::footprint::tree_released(sample) {
                0
            } else {
                bytes
            }
        };
        let mut rows: Vec<(usize, ProcRow)> = sample
            .procs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (order, d) = depth[i];
                (
                    order,
                    ProcRow {
                        pid: p.pid,
                        role: p.role,
                        comm: p.comm.clone(),
                        depth: d,
                        rss: p.rss_bytes,
                        pss: held(p.pss_bytes),
                        uss: held(p.uss_bytes),
                        swap: p.swap_bytes,
                        gpu: p.gpu_bytes,
                        // Nor a growth from readings of a tree that is
                        // going: its last one is far off any line.
                        growth: if super::footprint::tree_released(sample) {
                            crate::vocab::growth::Figure::Unknown
                        } else {
                            self.growth.figure(p.pid, p.start_time)
                        },
                        family: parents[i],
                    },
                )
            })
            .collect();
        let key = self.sort;
        rows.sort_by(|(oa, a), (ob, b)| {
            use std::cmp::Ordering;
            let by = match key {
                SortKey::Tree => oa.cmp(ob),
                SortKey::Pid => a.pid.cmp(&b.pid),
                SortKey::Comm => a.comm.cmp(&b.comm),
                SortKey::Pss => a.pss.cmp(&b.pss),
                SortKey::Rss => a.rss.cmp(&b.rss),
                SortKey::Uss => a.uss.cmp(&b.uss),
                SortKey::Swap => a.swap.cmp(&b.swap),
                SortKey::Gpu => a.gpu.cmp(&b.gpu),
                SortKey::Growth => sort_value(a.growth).total_cmp(&sort_value(b.growth)),
            };
            let by = if key.descending_by_default() != self.sort_reverse {
                by.reverse()
            } else {
                by
            };
            // Ties in pid order, so equal rows never swap between frames.
            match by {
                Ordering::Equal => a.pid.cmp(&b.pid),
                o => o,
            }
        });
        rows.into_iter().map(|(_, r)| r).collect()
    }
}

/// New scroll offset from the bottom after moving by `delta` rows (down is
/// positive, towards the newest line).
/// A growth figure's place in the growth sort: rates by value, flat as
/// none, unknown below every fall.
fn sort_value(g: crate::vocab::growth::Figure) -> f64 {
    use crate::vocab::growth::Figure;
    match g {
        Figure::Rate(r) => r,
        Figure::Flat => 0.0,
        Figure::Unknown => f64::NEG_INFINITY,
    }
}

fn scroll_from_bottom(cur: usize, delta: isize, max: usize) -> usize {
    match delta {
        isize::MIN => max,
        isize::MAX => 0,
        d if d < 0 => cur.saturating_add(d.unsigned_abs()).min(max),
        d => cur.saturating_sub(d.unsigned_abs()).min(max),
    }
}

/// For each process (by index): its position in a depth-first walk of the
/// tree (children in pid order) and its depth.
fn tree_order(sample: &Sample) -> Vec<(usize, usize)> {
    let procs = &sample.procs;
    let index: HashMap<u32, usize> = procs.iter().enumerate().map(|(i, p)| (p.pid, i)).collect();
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        if p.ppid != p.pid && index.contains_key(&p.ppid) {
            children.entry(p.ppid).or_default().push(i);
        } else {
            roots.push(i);
        }
    }
    let by_pid = |v: &mut Vec<usize>| v.sort_by_key(|&i| procs[i].pid);
    by_pid(&mut roots);
    children.values_mut().for_each(by_pid);
    let mut out = vec![(usize::MAX, 0); procs.len()];
    let mut stack: Vec<(usize, usize)> = roots.into_iter().rev().map(|i| (i, 0)).collect();
    let mut n = 0;
    while let Some((i, d)) = stack.pop() {
        if out[i].0 != usize::MAX {
            continue; // a cycle in stale data: visit once
        }
        out[i] = (n, d);
        n += 1;
        if let Some(kids) = children.get(&procs[i].pid) {
            stack.extend(kids.iter().rev().map(|&k| (k, d + 1)));
        }
    }
    // Processes only reachable through a cycle: after everything else.
    for o in out.iter_mut().filter(|o| o.0 == usize::MAX) {
        *o = (n, 0);
        n += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::fixtures::{bare_proc as proc, bare_sample as sample};
    use crate::vocab::growth::Figure;
    use crossterm::event::KeyEventState;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn ch(c: char) -> KeyEvent {
        key(KeyCode::Char(c))
    }

    fn view(t: f64) -> View {
        crate::vocab::model::testing::bare_view(t)
    }

    #[test]
    fn quit_asks_and_each_choice_does_what_it_says() {
        let mut app = App::new("x".into());
        assert_eq!(app.on_key(ch('q')), None);
        assert_eq!(app.overlay(), Overlay::Quit);
        // Unrelated keys do nothing while the modal is open.
        assert_eq!(app.on_key(ch('p')), None);
        assert_eq!(app.overlay(), Overlay::Quit);
        assert_eq!(app.on_key(key(KeyCode::Esc)), None);
        assert_eq!(app.overlay(), Overlay::None);

        app.on_key(ch('q'));
        assert_eq!(
            app.on_key(ch('d')),
            Some(UiCommand::Quit { stop_job: false })
        );
        assert_eq!(app.overlay(), Overlay::None);

        app.on_key(ch('q'));
        assert_eq!(
            app.on_key(ch('s')),
            Some(UiCommand::Quit { stop_job: true })
        );

        app.on_key(ch('q'));
        assert_eq!(app.on_key(ch('c')), None);
        assert_eq!(app.overlay(), Overlay::None);
    }

    #[test]
    fn pause_is_immediate() {
        let mut app = App::new("x".into());
        assert_eq!(app.on_key(ch('p')), Some(UiCommand::TogglePause));
        assert_eq!(app.overlay(), Overlay::None);
    }

    #[test]
    fn stop_needs_confirmation() {
        let mut app = App::new("x".into());
        assert_eq!(app.on_key(ch('s')), None);
        assert_eq!(app.overlay(), Overlay::ConfirmStop);
        assert_eq!(app.on_key(ch('n')), None);
        assert_eq!(app.overlay(), Overlay::None);
        app.on_key(ch('s'));
        assert_eq!(app.on_key(ch('y')), Some(UiCommand::Stop));
        app.on_key(ch('s'));
        assert_eq!(app.on_key(key(KeyCode::Enter)), Some(UiCommand::Stop));
    }

    #[test]
    fn restart_only_when_available() {
        let mut app = App::new("x".into());
        assert_eq!(app.on_key(ch('r')), None);
        assert_eq!(app.overlay(), Overlay::None);
        assert!(app.flash.is_some());
        // Any key clears the message.
        app.on_key(key(KeyCode::Down));
        assert!(app.flash.is_none());
        app.set_restart_available(true);
        app.on_key(ch('r'));
        assert_eq!(app.overlay(), Overlay::ConfirmRestart);
        assert_eq!(app.on_key(ch('y')), Some(UiCommand::Restart));
    }

    #[test]
    fn ctrl_c_is_forwarded_even_from_a_modal() {
        let mut app = App::new("x".into());
        let c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(app.on_key(c), Some(UiCommand::Interrupt));
        app.on_key(ch('q'));
        assert_eq!(app.on_key(c), Some(UiCommand::Interrupt));
        assert_eq!(app.overlay(), Overlay::Quit);
    }

    #[test]
    fn key_releases_are_ignored() {
        let mut app = App::new("x".into());
        let mut k = ch('p');
        k.kind = KeyEventKind::Release;
        k.state = KeyEventState::NONE;
        assert_eq!(app.on_key(k), None);
    }

    #[test]
    fn help_opens_and_closes() {
        let mut app = App::new("x".into());
        app.on_key(ch('?'));
        assert_eq!(app.overlay(), Overlay::Help);
        // Keys do not leak through the overlay.
        assert_eq!(app.on_key(ch('p')), None);
        app.on_key(ch('?'));
        assert_eq!(app.overlay(), Overlay::None);
        app.on_key(ch('?'));
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.overlay(), Overlay::None);
    }

    #[test]
    fn tab_cycles_focus() {
        let mut app = App::new("x".into());
        assert_eq!(app.focus(), Pane::Processes);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.focus(), Pane::Output);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.focus(), Pane::Events);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.focus(), Pane::Processes);
        app.on_key(key(KeyCode::BackTab));
        assert_eq!(app.focus(), Pane::Events);
    }

    #[test]
    fn sort_keys_select_and_reverse() {
        let mut app = App::new("x".into());
        app.on_sample(
            &sample(
                0.0,
                vec![proc(10, 1, 300), proc(11, 10, 100), proc(12, 10, 200)],
            ),
            &view(0.0),
        );
        let pids = |app: &App| app.proc_rows().iter().map(|r| r.pid).collect::<Vec<_>>();
        assert_eq!(pids(&app), [10, 11, 12]);
        assert_eq!(app.proc_rows()[1].depth, 1);
        app.on_key(ch('m'));
        assert_eq!(app.sort(), (SortKey::Pss, false));
        assert_eq!(pids(&app), [10, 12, 11]);
        app.on_key(ch('m'));
        assert_eq!(app.sort(), (SortKey::Pss, true));
        assert_eq!(pids(&app), [11, 12, 10]);
        app.on_key(ch('n'));
        assert_eq!(pids(&app), [10, 11, 12]);
        app.on_key(ch('t'));
        assert_eq!(app.sort(), (SortKey::Tree, false));
    }

    #[test]
    fn growth_per_minute_from_pss_history() {
        let mut app = App::new("x".into());
        for i in 0..20 {
            let t = i as f64;
            app.on_sample(
                &sample(t, vec![proc(10, 1, 1000), proc(11, 1, (1 + i) << 20)]),
                &view(t),
            );
        }
        app.on_key(ch('g'));
        let rows = app.proc_rows();
        assert_eq!(rows[0].pid, 11);
        assert_eq!(rows[0].growth, Figure::Rate((1 << 20) as f64));
        assert_eq!(rows[1].growth, Figure::Flat);
    }

    /// A process seen for 2 s, whose first PSS was not read yet (0), shows
    /// no rate: its start-up is not growth.
    #[test]
    fn a_new_process_shows_no_growth_yet() {
        let mut app = App::new("x".into());
        for (t, pss) in [(0.0, 0), (1.0, 13 << 20), (2.0, 13 << 20)] {
            app.on_sample(&sample(t, vec![proc(10, 1, pss)]), &view(t));
        }
        assert_eq!(app.proc_rows()[0].growth, Figure::Unknown);
    }

    #[test]
    fn process_selection_moves_and_follows_the_pid() {
        let mut app = App::new("x".into());
        let procs = vec![proc(10, 1, 300), proc(11, 10, 100), proc(12, 10, 200)];
        app.on_sample(&sample(0.0, procs), &view(0.0));
        app.on_key(key(KeyCode::Down));
        assert_eq!(app.selected, Some(10));
        app.on_key(key(KeyCode::Down));
        assert_eq!(app.selected, Some(11));
        app.on_key(key(KeyCode::End));
        assert_eq!(app.selected, Some(12));
        app.on_key(key(KeyCode::Down));
        assert_eq!(app.selected, Some(12));
        app.on_key(key(KeyCode::Home));
        assert_eq!(app.selected, Some(10));
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.selected, None);
    }

    #[test]
    fn output_scrolls_and_stays_anchored() {
        let mut app = App::new("x".into());
        for i in 0..50 {
            app.on_output(format!("line {i}\r\n").as_bytes());
        }
        app.viewport.output_rows.set(10);
        app.on_key(key(KeyCode::Tab));
        app.on_key(key(KeyCode::PageUp));
        assert_eq!(app.output_scroll, 9);
        app.on_key(key(KeyCode::Up));
        assert_eq!(app.output_scroll, 10);
        // New output while scrolled: the view does not move.
        app.on_output(b"new\r\nnewer\r\n");
        assert_eq!(app.output_scroll, 12);
        app.on_key(key(KeyCode::Home));
        assert_eq!(app.output_scroll, 52 - 10);
        app.on_key(key(KeyCode::End));
        assert_eq!(app.output_scroll, 0);
        // Following: new output does not scroll up.
        app.on_output(b"x\r\n");
        assert_eq!(app.output_scroll, 0);
    }

    #[test]
    fn events_are_described_and_bounded() {
        let mut app = App::new("x".into());
        app.on_event(UiEvent::RuleFiring {
            t: 3.0,
            rule: "low".into(),
            metric: "headroom_percent".into(),
            value: 9.75,
            threshold: 10.0,
        });
        app.on_event(UiEvent::OomKill {
            t: 4.0,
            pid: 7,
            comm: "python".into(),
            role: Some(Role::Worker),
        });
        app.on_event(UiEvent::Action {
            t: 5.0,
            action: ActionKind::Pause,
            reason: "low".into(),
            pids: vec![1, 2, 3],
            error: None,
        });
        app.on_event(UiEvent::Restart {
            t: 6.0,
            attempt: 2,
            degraded: vec![("NUM_WORKERS".into(), "2".into())],
        });
        let ev: Vec<_> = app
            .events()
            .map(|e| (e.severity, e.text.as_str()))
            .collect();
        assert_eq!(
            ev,
            [
                (
                    Severity::Warn,
                    "low firing: headroom 9.8% (threshold 10.0%)"
                ),
                (Severity::Critical, "OOM kill: 7 python (worker)"),
                (Severity::Act, "pause (low) 3 pids"),
                (Severity::Act, "restart: attempt 2 with NUM_WORKERS=2"),
            ]
        );
        for i in 0..(MAX_EVENTS + 10) {
            app.on_event(UiEvent::Note {
                t: 7.0,
                severity: Severity::Info,
                text: i.to_string(),
            });
        }
        assert_eq!(app.events().count(), MAX_EVENTS);
    }

    #[test]
    fn chart_is_bounded_and_downsampled() {
        let mut app = App::new("x".into());
        // An hour of samples every 0.5 s.
        for i in 0..7200 {
            let t = i as f64 * 0.5;
            let mut s = sample(t, vec![proc(10, 1, 100 + i)]);
            s.system.mem_total_bytes = 1 << 30;
            s.system.mem_available_bytes = 1 << 29;
            app.on_sample(&s, &view(t));
        }
        assert!(
            app.chart.len() <= CHART_MAX_POINTS + 2,
            "{}",
            app.chart.len()
        );
        // The first point is the last one at or past the window's edge.
        assert!(3599.5 - app.chart[0].t >= CHART_WINDOW_SECONDS);
        assert!(3599.5 - app.chart[1].t < CHART_WINDOW_SECONDS);
        // Merging keeps the maximum of the bucket.
        assert_eq!(app.chart.back().unwrap().pss, 100 + 7199);
        // A new attempt with its own clock starts a new chart.
        app.on_sample(&sample(1.0, vec![]), &view(1.0));
        assert_eq!(app.chart.len(), 1);
    }

    #[test]
    fn torch_stats_are_forgotten_with_their_process() {
        let mut app = App::new("x".into());
        app.on_sample(&sample(0.0, vec![proc(10, 1, 1)]), &view(0.0));
        app.on_torch(10, vec![(0, 5, 8)]);
        assert_eq!(app.torch[&10][0].reserved_bytes, 8);
        app.on_sample(&sample(1.0, vec![proc(11, 1, 1)]), &view(1.0));
        assert!(app.torch.is_empty());
    }

    #[test]
    fn tree_order_survives_cycles() {
        let s = sample(0.0, vec![proc(1, 2, 1), proc(2, 1, 1), proc(3, 0, 1)]);
        let order = tree_order(&s);
        let mut seen: Vec<usize> = order.iter().map(|o| o.0).collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2]);
    }
}
