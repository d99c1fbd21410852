//! The rules for one value, shared by the command line and the settings
//! file, so that `--warn-at 0.8` and `warn_at = 0.8` are refused with the
//! same words. Each returns the parsed value or a message that names the
//! text and what is expected.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::units::{self, SizeOrPercent};

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
    let sig = crate::model::parse_signal(text).ok_or_else(|| {
        format!("'{text}' is not a signal (expected e.g. TERM, USR1, INT or a number)")
    })?;
    if sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return Err(format!(
            "'{text}' cannot be caught, so the trainer could not checkpoint (expected a catchable signal such as TERM, USR1 or INT)"
        ));
    }
    Ok(sig)
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
}
