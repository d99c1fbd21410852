//! Validated settings for the policy: the command-line flags for the common
//! case and a TOML file (`--config FILE`, or `./oomguard.toml` when present)
//! for arbitrary rule lists. Invalid configuration is rejected before the
//! job starts, with a message naming the file, line, field and the accepted
//! values.
//!
//! ```toml
//! warn_at = "80%"          # usage of the nearest ceiling
//! critical_at = "92%"
//! on_critical = "stop"     # pause, stop, kill, restart
//! grace = "60s"
//!
//! [[rule]]
//! name = "swap-storm"
//! metric = "swap_in_rate"
//! above = "50MiB"          # per second for rates
//! for = "10s"
//! action = "warn"
//! ```

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::policy::{Action, Metric, Op, Policy, Rule, unit};
use crate::supervise::parse_signal;
use crate::units::{self, SizeOrPercent};

/// Why the configuration was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read '{path}': {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("cannot read '{path}' line {line}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{0}")]
    Flag(String),
}

/// The policy side of a run, after merging flags over the file.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    pub policy: Policy,
    pub grace: Duration,
    pub kill_after: Option<Duration>,
    pub checkpoint_signal: i32,
    pub on_warn: Option<String>,
    pub budget: Option<SizeOrPercent>,
    pub notify: Option<bool>,
    /// The file the settings came from, if any.
    pub file: Option<PathBuf>,
}

/// The policy flags as typed (all optional: unset means "file or default").
#[derive(Debug, Clone, Default)]
pub struct PolicyFlags {
    pub policy: Option<String>,
    pub warn_at: Option<f64>,
    pub critical_at: Option<f64>,
    pub on_critical: Option<Action>,
    pub max_pause: Option<Duration>,
    pub grace: Option<Duration>,
    pub checkpoint_signal: Option<i32>,
    pub on_warn: Option<String>,
    pub config: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    policy: Option<Spanned<String>>,
    warn_at: Option<Spanned<toml::Value>>,
    critical_at: Option<Spanned<toml::Value>>,
    on_critical: Option<Spanned<String>>,
    max_pause: Option<Spanned<toml::Value>>,
    grace: Option<Spanned<toml::Value>>,
    kill_after: Option<Spanned<toml::Value>>,
    checkpoint_signal: Option<Spanned<toml::Value>>,
    on_warn: Option<String>,
    budget: Option<Spanned<toml::Value>>,
    notify: Option<bool>,
    include_defaults: Option<bool>,
    rule: Option<Vec<Spanned<RawRule>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<Spanned<String>>,
    metric: Spanned<String>,
    below: Option<Spanned<toml::Value>>,
    above: Option<Spanned<toml::Value>>,
    #[serde(rename = "for")]
    for_: Option<Spanned<toml::Value>>,
    clear: Option<Spanned<toml::Value>>,
    cooldown: Option<Spanned<toml::Value>>,
    action: Spanned<String>,
    hook: Option<String>,
}

struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Ctx<'_> {
    fn line(&self, span: Range<usize>) -> usize {
        self.text[..span.start.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn err(&self, span: Range<usize>, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: self.line(span),
            message,
        }
    }
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn duration_of(
    ctx: &Ctx<'_>,
    field: &str,
    v: &Spanned<toml::Value>,
) -> Result<Duration, ConfigError> {
    let text = value_text(v.get_ref());
    units::parse_duration(&text).map_err(|_| {
        ctx.err(
            v.span(),
            format!("{field}: '{text}' is not a duration (expected e.g. 500ms, 60s, 10m)"),
        )
    })
}

/// A usage level such as `"80%"` (or 80) for `warn_at` / `critical_at`.
fn usage_percent(text: &str) -> Option<f64> {
    let t = text.trim();
    let v: f64 = t.strip_suffix('%').unwrap_or(t).trim().parse().ok()?;
    (0.0..=100.0).contains(&v).then_some(v)
}

/// Parses a threshold in the unit of its metric.
fn threshold(metric: Metric, text: &str) -> Result<f64, String> {
    let t = text.trim();
    match unit(metric) {
        "percent" => {
            let v: f64 = t
                .strip_suffix('%')
                .unwrap_or(t)
                .trim()
                .parse()
                .map_err(|_| format!("'{text}' is not a percentage (expected e.g. 20%)"))?;
            if (0.0..=100.0).contains(&v) {
                Ok(v)
            } else {
                Err(format!("'{text}' is not between 0% and 100%"))
            }
        }
        "bytes" => units::parse_size(t)
            .map(|b| b as f64)
            .map_err(|e| e.to_string()),
        "bytes_per_second" => {
            let t = t.strip_suffix("/s").unwrap_or(t);
            units::parse_size(t)
                .map(|b| b as f64)
                .map_err(|e| e.to_string())
        }
        _ => units::parse_duration(t)
            .map(|d| d.as_secs_f64())
            .map_err(|e| e.to_string()),
    }
}

fn expected_metrics() -> String {
    Metric::ALL
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads the file (explicit, or `./oomguard.toml` when present) and merges
/// the flags over it.
pub fn resolve(flags: &PolicyFlags) -> Result<PolicySettings, ConfigError> {
    let path = match &flags.config {
        Some(p) => Some(p.clone()),
        None => {
            let local = PathBuf::from("oomguard.toml");
            local.is_file().then_some(local)
        }
    };
    let text = match &path {
        Some(p) => Some(fs::read_to_string(p).map_err(|e| ConfigError::Read {
            path: p.clone(),
            reason: e.to_string(),
        })?),
        None => None,
    };
    resolve_text(flags, path.as_deref(), text.as_deref())
}

/// `resolve` on a file's text (testable without files).
pub fn resolve_text(
    flags: &PolicyFlags,
    path: Option<&Path>,
    text: Option<&str>,
) -> Result<PolicySettings, ConfigError> {
    let raw = match (path, text) {
        (Some(p), Some(t)) => Some(toml::from_str::<RawFile>(t).map_err(|e| {
            let line = e
                .span()
                .map_or(1, |s| t[..s.start.min(t.len())].matches('\n').count() + 1);
            ConfigError::Invalid {
                path: p.to_path_buf(),
                line,
                message: e.message().trim().to_string(),
            }
        })?),
        _ => None,
    };
    let empty = Path::new("");
    let ctx = Ctx {
        path: path.unwrap_or(empty),
        text: text.unwrap_or(""),
    };

    // Simple settings: flag > file > default.
    let mut warn = 80.0;
    let mut crit = 92.0;
    let mut on_critical = Action::Stop;
    let mut max_pause = Duration::from_secs(600);
    let mut grace = Duration::from_secs(60);
    let mut kill_after = None;
    let mut signal = libc::SIGTERM;
    let mut policy_name = "default".to_string();
    let mut budget = None;
    let mut custom: Vec<Rule> = Vec::new();
    let mut include_defaults = false;
    let mut on_warn = None;
    let mut notify = None;
    if let Some(raw) = &raw {
        if let Some(v) = &raw.policy {
            policy_name = v.get_ref().clone();
            if !["default", "none"].contains(&policy_name.as_str()) {
                return Err(ctx.err(
                    v.span(),
                    format!("unknown policy '{policy_name}' (expected default, none)"),
                ));
            }
        }
        for (field, slot, v) in [
            ("warn_at", &mut warn, &raw.warn_at),
            ("critical_at", &mut crit, &raw.critical_at),
        ] {
            if let Some(v) = v {
                let text = value_text(v.get_ref());
                *slot = usage_percent(&text).ok_or_else(|| {
                    ctx.err(
                        v.span(),
                        format!("{field}: '{text}' is not a usage percentage (expected e.g. 80%)"),
                    )
                })?;
            }
        }
        if let Some(v) = &raw.on_critical {
            on_critical = critical_action(v.get_ref()).ok_or_else(|| {
                ctx.err(
                    v.span(),
                    format!(
                        "unknown on_critical action '{}' (expected pause, stop, kill, restart)",
                        v.get_ref()
                    ),
                )
            })?;
        }
        if let Some(v) = &raw.max_pause {
            max_pause = duration_of(&ctx, "max_pause", v)?;
        }
        if let Some(v) = &raw.grace {
            grace = duration_of(&ctx, "grace", v)?;
        }
        if let Some(v) = &raw.kill_after {
            kill_after = Some(duration_of(&ctx, "kill_after", v)?);
        }
        if let Some(v) = &raw.checkpoint_signal {
            let text = value_text(v.get_ref());
            signal = parse_signal(&text).ok_or_else(|| {
                ctx.err(v.span(), format!("unknown checkpoint_signal '{text}' (expected a signal name such as TERM, USR1, or a number)"))
            })?;
        }
        if let Some(v) = &raw.budget {
            let text = value_text(v.get_ref());
            budget = Some(
                units::parse_size_or_percent(&text)
                    .map_err(|e| ctx.err(v.span(), format!("budget: {e}")))?,
            );
        }
        on_warn = raw.on_warn.clone();
        notify = raw.notify;
        include_defaults = raw.include_defaults.unwrap_or(false);
        for (i, r) in raw.rule.iter().flatten().enumerate() {
            custom.push(rule_from(&ctx, i, r)?);
        }
    }
    if let Some(p) = &flags.policy {
        policy_name = p.clone();
    }
    warn = flags.warn_at.unwrap_or(warn);
    crit = flags.critical_at.unwrap_or(crit);
    on_critical = flags.on_critical.unwrap_or(on_critical);
    max_pause = flags.max_pause.unwrap_or(max_pause);
    grace = flags.grace.unwrap_or(grace);
    signal = flags.checkpoint_signal.unwrap_or(signal);
    if flags.on_warn.is_some() {
        on_warn = flags.on_warn.clone();
    }
    if crit <= warn {
        return Err(ConfigError::Flag(format!(
            "the critical level ({crit}%) must be above the warning level ({warn}%): both are usage of the nearest ceiling"
        )));
    }
    let mut policy = match policy_name.as_str() {
        "none" => Policy::none(),
        "default" => Policy::default_with(warn, crit, on_critical),
        other => {
            return Err(ConfigError::Flag(format!(
                "unknown policy '{other}' (expected default, none)"
            )));
        }
    };
    if !custom.is_empty() {
        if !include_defaults {
            policy.rules.clear();
        }
        policy.rules.extend(custom);
    }
    policy.max_pause_seconds = max_pause.as_secs_f64();
    if on_critical == Action::Pause {
        policy.after_pause = Action::Stop;
    } else {
        policy.after_pause = on_critical;
    }
    let mut names = std::collections::HashSet::new();
    for r in &policy.rules {
        if !names.insert(r.name.clone()) {
            return Err(ConfigError::Flag(format!(
                "two rules are named '{}': rule names must be unique",
                r.name
            )));
        }
    }
    Ok(PolicySettings {
        policy,
        grace,
        kill_after,
        checkpoint_signal: signal,
        on_warn,
        budget,
        notify,
        file: path.map(Path::to_path_buf),
    })
}

/// The actions that may follow a critical rule.
pub fn critical_action(s: &str) -> Option<Action> {
    Action::from_name(s).filter(|a| *a != Action::Warn)
}

fn rule_from(ctx: &Ctx<'_>, i: usize, r: &Spanned<RawRule>) -> Result<Rule, ConfigError> {
    let span = r.span();
    let r = r.get_ref();
    let metric_name = r.metric.get_ref();
    let metric = Metric::from_name(metric_name).ok_or_else(|| {
        ctx.err(
            r.metric.span(),
            format!(
                "unknown metric '{metric_name}' (expected {})",
                expected_metrics()
            ),
        )
    })?;
    let action_name = r.action.get_ref();
    let action = Action::from_name(action_name).ok_or_else(|| {
        ctx.err(
            r.action.span(),
            format!(
                "unknown action '{action_name}' (expected {})",
                Action::NAMES
            ),
        )
    })?;
    let (op, limit) = match (&r.below, &r.above) {
        (Some(v), None) => (Op::Below, v),
        (None, Some(v)) => (Op::Above, v),
        _ => {
            return Err(ctx.err(
                span,
                format!("rule {}: give exactly one of 'below' or 'above'", i + 1),
            ));
        }
    };
    let text = value_text(limit.get_ref());
    let th = threshold(metric, &text).map_err(|m| {
        ctx.err(
            limit.span(),
            format!("{}: {m}", if op == Op::Below { "below" } else { "above" }),
        )
    })?;
    let name = r
        .name
        .as_ref()
        .map_or_else(|| format!("rule-{}", i + 1), |n| n.get_ref().clone());
    if metric.is_gpu() && action == Action::Kill {
        return Err(ctx.err(r.action.span(), format!(
            "GPU memory pressure is not a kernel OOM: action 'kill' is not allowed on '{metric_name}' (expected warn, pause, stop, restart)"
        )));
    }
    let mut rule = Rule::new(&name, metric, op, th, action);
    if let Some(v) = &r.clear {
        let text = value_text(v.get_ref());
        rule.clear =
            threshold(metric, &text).map_err(|m| ctx.err(v.span(), format!("clear: {m}")))?;
        let wrong_side = match op {
            Op::Below => rule.clear < th,
            Op::Above => rule.clear > th,
        };
        if wrong_side {
            return Err(ctx.err(
                v.span(),
                format!(
                    "clear: '{text}' must be on the safe side of the threshold '{}' (hysteresis)",
                    value_text(limit.get_ref())
                ),
            ));
        }
    }
    if let Some(v) = &r.for_ {
        rule.for_seconds = duration_of(ctx, "for", v)?.as_secs_f64();
    }
    if let Some(v) = &r.cooldown {
        rule.cooldown_seconds = duration_of(ctx, "cooldown", v)?.as_secs_f64();
    }
    rule.hook = r.hook.clone();
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(text: &str) -> Result<PolicySettings, ConfigError> {
        resolve_text(
            &PolicyFlags::default(),
            Some(Path::new("oomguard.toml")),
            Some(text),
        )
    }

    #[test]
    fn defaults_without_anything() {
        let s = resolve_text(&PolicyFlags::default(), None, None).unwrap();
        assert_eq!(s.policy, Policy::default_with(80.0, 92.0, Action::Stop));
        assert_eq!(s.grace, Duration::from_secs(60));
        assert_eq!(s.checkpoint_signal, libc::SIGTERM);
    }

    #[test]
    fn flags_override_the_file() {
        let flags = PolicyFlags {
            warn_at: Some(70.0),
            on_critical: Some(Action::Kill),
            ..Default::default()
        };
        let s = resolve_text(
            &flags,
            Some(Path::new("f.toml")),
            Some("warn_at = \"60%\"\ncritical_at = 95\ngrace = \"2m\"\n"),
        )
        .unwrap();
        assert_eq!(s.policy.thresholds(), (Some(30.0), Some(5.0)));
        assert_eq!(s.policy.rules[1].action, Action::Kill);
        assert_eq!(s.grace, Duration::from_secs(120));
    }

    #[test]
    fn custom_rules_replace_defaults_unless_included() {
        let text = "[[rule]]\nname = \"swap\"\nmetric = \"swap_in_rate\"\nabove = \"50MiB/s\"\nfor = \"10s\"\naction = \"warn\"\n";
        let s = from(text).unwrap();
        assert_eq!(s.policy.rules.len(), 1);
        let r = &s.policy.rules[0];
        assert_eq!(
            (r.metric, r.op, r.threshold, r.for_seconds),
            (Metric::SwapInRate, Op::Above, 50.0 * 1048576.0, 10.0)
        );
        let s = from(&format!("include_defaults = true\n{text}")).unwrap();
        assert_eq!(s.policy.rules.len(), 5);
    }

    #[test]
    fn policy_none() {
        let flags = PolicyFlags {
            policy: Some("none".into()),
            ..Default::default()
        };
        assert!(
            resolve_text(&flags, None, None)
                .unwrap()
                .policy
                .rules
                .is_empty()
        );
    }

    #[test]
    fn the_example_message() {
        let text = "warn_at = \"80%\"\n\n[[rule]]\nmetric = \"headroom_percent\"\nbelow = \"5%\"\naction = \"pase\"\n";
        let e = from(text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot read 'oomguard.toml' line 6: unknown action 'pase' (expected warn, pause, stop, kill, restart)"
        );
    }

    #[test]
    fn critical_below_warn_is_rejected() {
        let flags = PolicyFlags {
            warn_at: Some(90.0),
            critical_at: Some(85.0),
            ..Default::default()
        };
        assert!(
            resolve_text(&flags, None, None)
                .unwrap_err()
                .to_string()
                .contains("must be above")
        );
    }
}
