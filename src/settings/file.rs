//! The settings file (`--config FILE`, or `./oomguard.toml` when present):
//! its TOML schema and its validation, with the file, line, field and the
//! accepted values in every error. It only reads the file: which value wins
//! over a flag or a default is decided in `settings::resolve`.
//!
//! ```toml
//! warn_at = "80%"          # usage of the nearest ceiling
//! critical_at = "92%"
//! on_critical = "stop"     # pause, stop, kill, restart
//! grace = "60s"
//! interval = "1s"
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

use super::Layer;
use crate::engine::policy::{Action, Metric, Op, Rule, unit};
use crate::vocab::units;

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

/// What the file says, validated; `None` where it is silent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileSettings {
    /// The file these came from.
    pub path: PathBuf,
    pub layer: Layer,
    /// `notify = false` turns desktop notifications off.
    pub notify: Option<bool>,
    /// Custom rules, in file order.
    pub rules: Vec<Rule>,
    /// Keep the default rules next to the custom ones.
    pub include_defaults: bool,
}

/// The keys that are not settings of the table in `options`. The
/// settings themselves are read key by key (`Layer::set`).
#[derive(Debug, Deserialize)]
struct RawFile {
    notify: Option<bool>,
    include_defaults: Option<bool>,
    rule: Option<Vec<Spanned<RawRule>>>,
}

/// Keys of the file besides the settings of the table.
const OTHER_KEYS: &[&str] = &["notify", "include_defaults", "rule"];

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

    /// Applies a value rule (`crate::settings::values`) to a field.
    fn value<T>(
        &self,
        field: &str,
        v: &Spanned<toml::Value>,
        rule: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        rule(&value_text(v.get_ref())).map_err(|m| self.err(v.span(), format!("{field}: {m}")))
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

/// `for` and `cooldown` may be zero.
fn any_duration(text: &str) -> Result<Duration, String> {
    units::parse_duration(text).map_err(|e| e.to_string())
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

/// Reads the file named by `--config`, or `./oomguard.toml` when present
/// and `look_in_cwd` (the demo does not, so a user's file cannot change it).
pub fn read(
    explicit: Option<&Path>,
    look_in_cwd: bool,
) -> Result<Option<FileSettings>, ConfigError> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let local = PathBuf::from("oomguard.toml");
            if !(look_in_cwd && local.is_file()) {
                return Ok(None);
            }
            local
        }
    };
    let text = fs::read_to_string(&path).map_err(|e| ConfigError::Read {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    parse(&path, &text).map(Some)
}

/// Validates a settings file's text (testable without files).
pub fn parse(path: &Path, text: &str) -> Result<FileSettings, ConfigError> {
    let raw = toml::from_str::<RawFile>(text).map_err(|e| {
        let line = e.span().map_or(1, |s| {
            text[..s.start.min(text.len())].matches('\n').count() + 1
        });
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            message: e.message().trim().to_string(),
        }
    })?;
    let ctx = Ctx { path, text };
    // Parsed a second time as key → value, so each setting is read by its
    // own rule with the line of its value.
    let table: std::collections::BTreeMap<Spanned<String>, Spanned<toml::Value>> =
        toml::from_str(text)
            .map_err(|e| ctx.err(e.span().unwrap_or(0..0), e.message().trim().into()))?;
    let mut out = Layer::default();
    for (key, value) in &table {
        let name = key.get_ref().as_str();
        if OTHER_KEYS.contains(&name) {
            continue;
        }
        let text = value_text(value.get_ref());
        match out.set(name, &text) {
            Some(Ok(())) => {}
            Some(Err(message)) => return Err(ctx.err(value.span(), message)),
            None => {
                let mut known: Vec<&str> = Layer::KEYS.iter().chain(OTHER_KEYS).copied().collect();
                known.sort_unstable();
                return Err(ctx.err(
                    key.span(),
                    format!(
                        "unknown key '{name}' (expected one of {})",
                        known.join(", ")
                    ),
                ));
            }
        }
    }
    let rules = raw
        .rule
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| rule_from(&ctx, i, r))
        .collect::<Result<_, _>>()?;
    Ok(FileSettings {
        path: path.to_path_buf(),
        layer: out,
        notify: raw.notify,
        rules,
        include_defaults: raw.include_defaults.unwrap_or(false),
    })
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
            "GPU memory pressure is not a kernel OOM: action 'kill' is not allowed on '{metric_name}' (expected warn, checkpoint, pause, stop, restart)"
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
        rule.for_seconds = ctx.value("for", v, any_duration)?.as_secs_f64();
    }
    if let Some(v) = &r.cooldown {
        rule.cooldown_seconds = ctx.value("cooldown", v, any_duration)?.as_secs_f64();
    }
    rule.hook = r.hook.clone();
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::Op;

    fn from(text: &str) -> Result<FileSettings, ConfigError> {
        parse(Path::new("oomguard.toml"), text)
    }

    #[test]
    fn custom_rules_are_read_in_order() {
        let text = "[[rule]]\nname = \"swap\"\nmetric = \"swap_in_rate\"\nabove = \"50MiB/s\"\nfor = \"10s\"\naction = \"warn\"\n";
        let f = from(text).unwrap();
        assert_eq!(f.rules.len(), 1);
        assert!(!f.include_defaults);
        let r = &f.rules[0];
        assert_eq!(
            (r.metric, r.op, r.threshold, r.for_seconds),
            (Metric::SwapInRate, Op::Above, 50.0 * 1048576.0, 10.0)
        );
        assert!(
            from(&format!("include_defaults = true\n{text}"))
                .unwrap()
                .include_defaults
        );
    }

    #[test]
    fn the_example_message() {
        let text = "warn_at = \"80%\"\n\n[[rule]]\nmetric = \"headroom_percent\"\nbelow = \"5%\"\naction = \"pase\"\n";
        let e = from(text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot read 'oomguard.toml' line 6: unknown action 'pase' (expected warn, relieve, checkpoint, pause, stop, kill, restart)"
        );
    }

    #[test]
    fn silent_file_sets_nothing() {
        assert_eq!(from("").unwrap().layer, Layer::default());
    }
}
