//! The rules for one value, shared by the command line and the settings
//! file, so that `--warn-at 0.8` and `warn_at = 0.8` are refused with the
//! same words. Each returns the parsed value or a message that names the
//! text and what is expected.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::vocab::units::{self, SizeOrPercent};

/// A share of the nearest ceiling: `80%` or `80`. A bare number below 1 is
/// refused: `0.8` is far more likely a fraction meant as 80 % than a
/// warning at 0.8 % usage, and guessing either way is worse than asking.
pub fn usage_percent(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, has_sign) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let v: f64 = num.parse().map_err(|_| {
        format!("'{text}' is not a usage percentage (expected a share of the ceiling, e.g. 80%)")
    })?;
    if !(v > 0.0 && v < 100.0) {
        return Err(format!(
            "'{text}' is not a usage percentage between 0% and 100% (e.g. 80%)"
        ));
    }
    if !has_sign && v < 1.0 {
        return Err(format!(
            "'{text}' looks like a fraction: write the percentage with a % sign (e.g. {}% or {v}%)",
            v * 100.0
        ));
    }
    Ok(v)
}

/// The signal that asks the trainer to checkpoint: it must be one the
/// trainer can catch, or the graceful stop would be a kill.
pub fn checkpoint_signal(text: &str) -> Result<i32, String> {
    let sig = crate::vocab::model::parse_signal(text).ok_or_else(|| {
        format!("'{text}' is not a signal (expected e.g. TERM, USR1, INT or a number)")
    })?;
    if sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return Err(format!(
            "'{text}' cannot be caught, so the trainer could not checkpoint (expected a catchable signal such as TERM, USR1 or INT)"
        ));
    }
    Ok(sig)
}

/// What a signal oomguard receives asks of the job (`--on-signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// Every rank saves the step it completed, then the job ends.
    CheckpointAndExit,
    /// Every rank saves, and training goes on.
    Checkpoint,
    /// Passed on to the job as a terminal would (a USR1 or USR2 only to a
    /// process that catches or ignores it; SIGTERM to the others).
    Forward,
}

impl SignalAction {
    pub fn name(self) -> &'static str {
        match self {
            SignalAction::CheckpointAndExit => "checkpoint_and_exit",
            SignalAction::Checkpoint => "checkpoint",
            SignalAction::Forward => "forward",
        }
    }
}

/// The signals whose meaning `--on-signal` sets, with their defaults: a
/// scheduler's preemption or time limit (TERM), its advance warning
/// (`--signal=USR1@90`, submitit's USR2) and an interrupt all save first.
pub const SIGNAL_DEFAULTS: [(i32, SignalAction); 4] = [
    (libc::SIGTERM, SignalAction::CheckpointAndExit),
    (libc::SIGUSR1, SignalAction::CheckpointAndExit),
    (libc::SIGUSR2, SignalAction::CheckpointAndExit),
    (libc::SIGINT, SignalAction::CheckpointAndExit),
];

/// `--on-signal`: each of TERM, USR1, USR2 and INT mapped to an action;
/// a signal the text does not name keeps its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalMap([(i32, SignalAction); 4]);

impl Default for SignalMap {
    fn default() -> Self {
        SignalMap(SIGNAL_DEFAULTS)
    }
}

impl SignalMap {
    /// The action for `sig`; `None` for a signal the map does not cover
    /// (HUP, QUIT: always passed on).
    pub fn get(&self, sig: i32) -> Option<SignalAction> {
        self.0.iter().find(|(s, _)| *s == sig).map(|(_, a)| *a)
    }
}

/// `TERM=checkpoint_and_exit,USR1=forward`: pairs separated by commas or
/// spaces; signals named as `kill -l` does (`USR1`, `SIGUSR1`, `10`).
pub fn signal_map(text: &str) -> Result<SignalMap, String> {
    let mut map = SignalMap::default();
    let expected = "expected SIGNAL=ACTION pairs such as TERM=checkpoint_and_exit,USR1=forward; \
                    SIGNAL one of TERM, USR1, USR2, INT; ACTION one of checkpoint_and_exit, \
                    checkpoint, forward";
    for pair in text.split([',', ' ']).filter(|p| !p.trim().is_empty()) {
        let (sig, action) = pair
            .split_once('=')
            .ok_or_else(|| format!("'{pair}' is not SIGNAL=ACTION ({expected})"))?;
        let sig = crate::vocab::model::parse_signal(sig)
            .filter(|s| map.get(*s).is_some())
            .ok_or_else(|| {
                format!(
                    "'{}' is not a signal --on-signal maps ({expected})",
                    sig.trim()
                )
            })?;
        let action = match action.trim().replace('-', "_").as_str() {
            "checkpoint_and_exit" => SignalAction::CheckpointAndExit,
            "checkpoint" => SignalAction::Checkpoint,
            "forward" => SignalAction::Forward,
            other => return Err(format!("'{other}' is not an action ({expected})")),
        };
        if let Some(slot) = map.0.iter_mut().find(|(s, _)| *s == sig) {
            slot.1 = action;
        }
    }
    Ok(map)
}

/// The exit code of a stop (`--stop-code`): any code a requeue rule can
/// match, except those that say something else of oomguard's (a usage
/// error, its own failure, lost output, the `--fail-above` gate, a command
/// that could not run) and success.
pub fn stop_code(text: &str) -> Result<i32, String> {
    let code: i32 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not an exit code (expected 1-255, e.g. 75)"))?;
    let taken = match code {
        0 => Some("success: a requeue rule could not tell a stop from a finished job"),
        2 => Some("a usage error"),
        70 => Some("oomguard's own failure"),
        74 => Some("output that could not be written"),
        76 => Some("the --fail-above gate"),
        78 => Some("a stop without progress, not to be requeued (--requeue-limit)"),
        126 | 127 => Some("a command that could not be run"),
        _ => None,
    };
    if let Some(what) = taken {
        return Err(format!(
            "'{text}' already means {what} (pick another, e.g. 75 or 143)"
        ));
    }
    if !(1..=255).contains(&code) {
        return Err(format!(
            "'{text}' is not an exit code (expected 1-255, e.g. 75)"
        ));
    }
    Ok(code)
}

/// A share of one core for oomguard's own work: `1%` (or `1`) is 0.01.
pub fn core_share(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let v: f64 = t
        .strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a share of one core (e.g. 1% or 0.5%)"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("'{text}' must be above 0% and at most 100%"));
    }
    Ok(v / 100.0)
}

/// A duration greater than zero.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    let d = units::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("'{text}' must be greater than zero"));
    }
    Ok(d)
}

/// Free text (a command, a glob), taken as written.
pub fn text(text: &str) -> Result<String, String> {
    Ok(text.to_string())
}

/// A path; an empty one names nothing.
pub fn path(text: &str) -> Result<std::path::PathBuf, String> {
    if text.is_empty() {
        return Err("an empty path names nothing (expected a directory, e.g. ckpt/)".into());
    }
    Ok(std::path::PathBuf::from(text))
}

/// A count: 0 or more.
pub fn count(text: &str) -> Result<u32, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a count (expected e.g. 3)"))
}

/// A size greater than zero.
pub fn positive_size(text: &str) -> Result<u64, String> {
    match units::parse_size(text).map_err(|e| e.to_string())? {
        0 => Err(format!("'{text}' must be greater than zero (e.g. 40GiB)")),
        n => Ok(n),
    }
}

/// A memory budget: bytes or a share of RAM, never zero.
pub fn budget(text: &str) -> Result<SizeOrPercent, String> {
    let parsed = units::parse_size_or_percent(text).map_err(|e| e.to_string())?;
    // A bare number is bytes, so `0.75` would be a 1-byte budget that
    // stops every job at once: far more likely a fraction meant as 75 %.
    if let Ok(v) = text.trim().parse::<f64>()
        && v > 0.0
        && v < 1.0
    {
        return Err(format!(
            "'{text}' looks like a fraction: write a share of RAM with a % sign (e.g. {}%) or a size with its unit (e.g. 40GiB)",
            v * 100.0
        ));
    }
    match parsed {
        SizeOrPercent::Bytes(0) => Err(format!(
            "'{text}' must be greater than zero (expected e.g. 40GiB or 75%)"
        )),
        SizeOrPercent::Bytes(n) if n < MIN_BUDGET => Err(format!(
            "'{text}' is {n} bytes, too little for any job (a bare number is bytes; expected e.g. 40GiB or 75%)"
        )),
        SizeOrPercent::Percent(p) if p <= 0.0 => Err(format!(
            "'{text}' must be greater than zero (expected e.g. 40GiB or 75%)"
        )),
        b => Ok(b),
    }
}

/// The least `--budget` taken: below it no process starts, so a smaller
/// one is a mistake in units.
const MIN_BUDGET: u64 = 1 << 20;

/// `HOST:PORT`, where HOST may be a name (`localhost:9465`) or an address
/// (`127.0.0.1:9465`, `[::1]:9465`).
pub fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let expected = "expected HOST:PORT, e.g. 127.0.0.1:9465 or localhost:9465";
    if !text.contains(':') {
        return Err(format!("'{text}' has no port ({expected})"));
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| format!("'{text}' cannot be resolved: {e} ({expected})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("'{text}' resolves to no address ({expected})"))
}

/// The mechanisms `--without` turns off, one by one: for the tests that
/// prove each acts (a control with only that one missing), and for ruling
/// one out when debugging. Hidden from `--help`: a user has no reason to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Without {
    /// The v1 usage threshold (`cgroup.event_control`).
    pub usage_threshold: bool,
    /// The PSI trigger.
    pub psi: bool,
    /// The v2 `memory.events` wake-up.
    pub memory_events: bool,
    /// The cheap loop over the limit's usage counter.
    pub cheap_loop: bool,
    /// `memory.high` on oomguard's own v2 cgroup.
    pub memory_high: bool,
}

impl Without {
    /// The names, as `--without` reads them.
    pub const NAMES: [&'static str; 6] = [
        "usage-threshold",
        "psi",
        "memory-events",
        "cheap-loop",
        "memory-high",
        "wakeups",
    ];
}

/// `usage-threshold,psi,...`: `wakeups` is every wake-up at once (the
/// threshold, PSI, `memory.events` and the cheap loop: `--interval` polling
/// only); `none` turns nothing off.
pub fn without(text: &str) -> Result<Without, String> {
    let mut w = Without::default();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "usage-threshold" => w.usage_threshold = true,
            "psi" => w.psi = true,
            "memory-events" => w.memory_events = true,
            "cheap-loop" => w.cheap_loop = true,
            "memory-high" => w.memory_high = true,
            "wakeups" => {
                w.usage_threshold = true;
                w.psi = true;
                w.memory_events = true;
                w.cheap_loop = true;
            }
            "none" => {}
            other => {
                return Err(format!(
                    "'{other}' is not a mechanism --without knows (expected a list of {}, or none)",
                    Without::NAMES.join(", ")
                ));
            }
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_percent_refuses_fractions_and_extremes() {
        assert_eq!(usage_percent("80%"), Ok(80.0));
        assert_eq!(usage_percent("80"), Ok(80.0));
        assert_eq!(usage_percent("0.5%"), Ok(0.5));
        let e = usage_percent("0.8").unwrap_err();
        assert!(e.contains("'0.8'") && e.contains("80%"), "{e}");
        for bad in ["0", "0%", "100%", "120", "-5", "x", ""] {
            assert!(usage_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checkpoint_signal_must_be_catchable() {
        assert_eq!(checkpoint_signal("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(checkpoint_signal("15"), Ok(libc::SIGTERM));
        for bad in ["KILL", "SIGKILL", "9", "STOP", "NOPE"] {
            assert!(checkpoint_signal(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn zero_is_refused() {
        assert!(budget("0").is_err());
        assert!(budget("0%").is_err());
        assert!(budget("0GiB").is_err());
        let fraction = budget("0.75").unwrap_err();
        assert!(
            fraction.contains("looks like a fraction") && fraction.contains("75%"),
            "{fraction}"
        );
        assert!(
            budget("4096")
                .unwrap_err()
                .contains("4096 bytes, too little")
        );
        assert_eq!(budget("1MiB"), Ok(SizeOrPercent::Bytes(1 << 20)));
        assert_eq!(budget("0.5GiB"), Ok(SizeOrPercent::Bytes(1 << 29)));
        assert_eq!(budget("75%"), Ok(SizeOrPercent::Percent(75.0)));
        assert!(positive_size("0").is_err());
        assert!(positive_duration("0s").is_err());
    }

    #[test]
    fn listen_addresses_take_names() {
        assert_eq!(
            listen_addr("127.0.0.1:9465").unwrap().to_string(),
            "127.0.0.1:9465"
        );
        let a = listen_addr("localhost:9465").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 9465, "{a}");
        assert!(listen_addr("localhost").unwrap_err().contains("no port"));
        assert!(listen_addr("nosuchhost.invalid:1").is_err());
    }

    #[test]
    fn a_signal_map_overrides_only_what_it_names() {
        let m = signal_map("USR1=forward, INT=checkpoint").unwrap();
        assert_eq!(m.get(libc::SIGUSR1), Some(SignalAction::Forward));
        assert_eq!(m.get(libc::SIGINT), Some(SignalAction::Checkpoint));
        assert_eq!(m.get(libc::SIGTERM), Some(SignalAction::CheckpointAndExit));
        assert_eq!(m.get(libc::SIGUSR2), Some(SignalAction::CheckpointAndExit));
        assert_eq!(m.get(libc::SIGHUP), None);
        assert_eq!(signal_map("").unwrap(), SignalMap::default());
        assert_eq!(
            signal_map("SIGTERM=checkpoint-and-exit").unwrap(),
            SignalMap::default()
        );
        for bad in ["USR1", "HUP=forward", "TERM=save", "NOPE=forward"] {
            assert!(signal_map(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_stop_code_never_says_something_else_of_oomguards() {
        assert_eq!(stop_code("75"), Ok(75));
        assert_eq!(stop_code("138"), Ok(138));
        for bad in ["0", "2", "70", "74", "76", "126", "127", "256", "-1", "x"] {
            assert!(stop_code(bad).is_err(), "{bad}");
        }
        assert!(stop_code("74").unwrap_err().contains("output"));
    }

    #[test]
    fn without_turns_off_each_mechanism_by_name_and_refuses_others() {
        let w = without("psi, cheap-loop").unwrap();
        assert!(w.psi && w.cheap_loop && !w.usage_threshold && !w.memory_events);
        let all = without("wakeups").unwrap();
        assert!(all.usage_threshold && all.psi && all.memory_events && all.cheap_loop);
        assert!(!all.memory_high);
        assert_eq!(without("none").unwrap(), Without::default());
        let e = without("psi,turbo").unwrap_err();
        assert!(
            e.contains("'turbo'") && e.contains("usage-threshold"),
            "{e}"
        );
    }
}
