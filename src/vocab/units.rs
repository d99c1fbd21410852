//! Sizes and durations as users type them (`40GiB`, `75%`, `500ms`) and as
//! oomguard prints them (`1.2 GiB`). Parsing errors carry the offending text
//! so messages can quote it.

use std::fmt;
use std::time::Duration;

/// A size given either in bytes or as a percentage of something the caller
/// resolves later (RAM for `--budget`, the nearest ceiling for thresholds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeOrPercent {
    Bytes(u64),
    Percent(f64),
}

/// Why a size or duration could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    #[error("'{0}' is not a size (expected e.g. 512MiB, 40GiB, 1.5G or a byte count)")]
    Size(String),
    #[error("'{0}' is not a percentage between 0 and 100")]
    Percent(String),
    #[error("'{0}' is not a duration (expected e.g. 500ms, 10s, 5m)")]
    Duration(String),
}

/// Parses `512MiB`, `40GiB`, `1.5G`, `300M`, `4096`, `2 GB`. Decimal SI
/// suffixes (`GB`) are honoured as powers of 1000 because that is what they
/// mean; the bare single letters (`G`) follow `free`/`docker` and mean 1024.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| err())?;
    let mult: f64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(err()),
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Parses `75%` as a percentage and anything else as a size.
pub fn parse_size_or_percent(text: &str) -> Result<SizeOrPercent, UnitError> {
    let t = text.trim();
    match t.strip_suffix('%') {
        Some(p) => {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| UnitError::Percent(text.to_string()))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(UnitError::Percent(text.to_string()));
            }
            Ok(SizeOrPercent::Percent(v))
        }
        None => parse_size(t).map(SizeOrPercent::Bytes),
    }
}

/// Parses `500ms`, `10s`, `1m30s`, `2h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(UnitError::Duration(text.to_string()));
    }
    humantime::parse_duration(t).map_err(|_| UnitError::Duration(text.to_string()))
}

/// Human-readable binary size: `812.0 MiB`, `1.25 GiB`.
#[derive(Debug, Clone, Copy)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut i = 0;
        while v >= 1024.0 && i + 1 < UNITS.len() {
            v /= 1024.0;
            i += 1;
        }
        if i == 0 {
            write!(f, "{} B", self.0)
        } else if v >= 100.0 {
            write!(f, "{v:.0} {}", UNITS[i])
        } else {
            write!(f, "{v:.1} {}", UNITS[i])
        }
    }
}

/// Human-readable duration with at most two units: `3h 12m`, `45.2s`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m {:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h {:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("40GiB").unwrap(), 40 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2 GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("300m").unwrap(), 300 << 20);
        for bad in ["", "G", "12XB", "-1G", "1e999G", "1..2G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percents() {
        assert_eq!(
            parse_size_or_percent("75%").unwrap(),
            SizeOrPercent::Percent(75.0)
        );
        assert_eq!(
            parse_size_or_percent("1GiB").unwrap(),
            SizeOrPercent::Bytes(1 << 30)
        );
        assert!(parse_size_or_percent("120%").is_err());
        assert!(parse_size_or_percent("x%").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("0.25").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn human() {
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(1536).to_string(), "1.5 KiB");
        assert_eq!(HumanBytes(300 << 20).to_string(), "300 MiB");
        assert_eq!(human_duration(Duration::from_secs(3725)), "1h 02m");
    }
}
