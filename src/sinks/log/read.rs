//! The one reader of logs, shared by `report` and `replay`: a line at a
//! time with a length cap, lenient about what is not ours, each line of
//! ours read through its [`Event`] type.
//!
//! Memory follows the longest line kept, not the file: a line longer than
//! [`crate::vocab::forensics::MAX_LINE_BYTES`] is skipped without being held, and
//! bytes that are not UTF-8 are replaced. The last non-blank line is held
//! back one line, so a reader can tell a log cut short (its last line is
//! incomplete) from a broken line in the middle.

use std::io::BufRead;

use serde_json::Value;

use super::{Event, LineHead, SCHEMA};

/// One line of a log.
#[derive(Debug)]
pub enum Item {
    /// A line of ours (schema `oomguard/1`).
    Line(Box<Line>),
    /// A line skipped, and why.
    Skipped { n: usize, why: Skip },
}

/// A line of ours, with its envelope and its event.
#[derive(Debug)]
pub struct Line {
    /// 1-based line number.
    pub n: usize,
    pub head: LineHead,
    /// The line's text (a key given twice is kept once).
    pub raw: String,
    /// The event, `None` when the line names none or one this version does
    /// not know; an error when its body does not read as its type.
    pub event: Result<Option<Event>, serde_json::Error>,
}

/// Why a line was not read.
#[derive(Debug)]
pub enum Skip {
    TooLong,
    NotAnObject,
    /// Not JSON; `last` when no line follows (the log was cut short).
    NotJson {
        error: serde_json::Error,
        last: bool,
    },
    /// A JSON object without a `schema` string: the job's own output, or a
    /// hand-written line.
    NoSchema,
    /// Another schema (a newer major version of the log).
    OtherSchema(String),
}

/// The lines of a log, as [`Item`]s.
pub struct LogLines<R> {
    input: R,
    buf: Vec<u8>,
    held: Vec<u8>,
    held_n: Option<usize>,
    n: usize,
    /// A line too long to read, reported after the line held before it.
    too_long: Option<usize>,
    done: bool,
}

impl<R: BufRead> LogLines<R> {
    pub fn new(input: R) -> Self {
        Self {
            input,
            buf: Vec::new(),
            held: Vec::new(),
            held_n: None,
            n: 0,
            too_long: None,
            done: false,
        }
    }
}

impl<R: BufRead> Iterator for LogLines<R> {
    type Item = std::io::Result<Item>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(n) = self.too_long.take() {
            return Some(Ok(Item::Skipped {
                n,
                why: Skip::TooLong,
            }));
        }
        while !self.done {
            let cap = crate::vocab::forensics::MAX_LINE_BYTES;
            let (read, cut) = match crate::vocab::forensics::read_line_capped(
                &mut self.input,
                &mut self.buf,
                cap,
            ) {
                Ok(r) => r,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            if read == 0 {
                self.done = true;
                break;
            }
            self.n += 1;
            if cut {
                let n = self.n;
                // Not the last line, whatever follows: the held one goes
                // first, to keep the order.
                if let Some(prev) = self.held_n.take() {
                    self.too_long = Some(n);
                    return Some(Ok(item(prev, &self.held, false)));
                }
                return Some(Ok(Item::Skipped {
                    n,
                    why: Skip::TooLong,
                }));
            }
            if self.buf.trim_ascii().is_empty() {
                continue;
            }
            // The two buffers trade places, so no line is copied.
            let prev = self.held_n.replace(self.n);
            std::mem::swap(&mut self.buf, &mut self.held);
            if let Some(n) = prev {
                return Some(Ok(item(n, &self.buf, false)));
            }
        }
        let n = self.held_n.take()?;
        Some(Ok(item(n, &self.held, true)))
    }
}

/// Reads line `n`; `last` when no other line follows it.
fn item(n: usize, bytes: &[u8], last: bool) -> Item {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match envelope(text, last) {
        Ok((mut raw, head)) => {
            let read = |raw: &str| match head.event.as_deref() {
                Some(name) => Event::read(name, raw),
                None => Ok(None),
            };
            let mut event = read(&raw);
            // A key given twice in the body: read it once, as the
            // envelope was.
            if event
                .as_ref()
                .is_err_and(|e| e.classify() == serde_json::error::Category::Data)
                && let Ok(v) = serde_json::from_str::<Value>(&raw)
                && let once = v.to_string()
                && once != raw
            {
                event = read(&once);
                raw = once;
            }
            Item::Line(Box::new(Line {
                n,
                head,
                raw,
                event,
            }))
        }
        Err(why) => Item::Skipped { n, why },
    }
}

/// The line as JSON text and its envelope, or why it is not ours.
fn envelope(text: &str, last: bool) -> Result<(String, LineHead), Skip> {
    // The envelope is read straight from the text (every field of it reads
    // whatever its value), so a failure is the text's: not JSON, or JSON
    // that is not an object.
    if !text.starts_with('{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => Skip::NotAnObject,
            Err(error) => Skip::NotJson { error, last },
        });
    }
    let mut raw = text.to_string();
    let head = serde_json::from_str::<LineHead>(&raw).or_else(|e| {
        // A key given twice (valid JSON; the last one counts) is the one
        // thing a typed reader refuses: read it once.
        if e.classify() != serde_json::error::Category::Data {
            return Err(e);
        }
        let once = serde_json::from_str::<Value>(&raw)?.to_string();
        let head = serde_json::from_str::<LineHead>(&once)?;
        raw = once;
        Ok(head)
    });
    let head = head.map_err(|error| Skip::NotJson { error, last })?;
    match &head.schema {
        Some(Value::String(s)) if s == SCHEMA => Ok((raw, head)),
        Some(Value::String(s)) => Err(Skip::OtherSchema(s.clone())),
        Some(_) | None => Err(Skip::NoSchema),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(text: &str) -> Vec<Item> {
        LogLines::new(text.as_bytes()).map(Result::unwrap).collect()
    }

    #[test]
    fn lines_of_ours_and_the_rest_are_told_apart() {
        let long = format!(
            "{{\"schema\":\"oomguard/1\",\"event\":\"x\",\"pad\":\"{}\"}}",
            "a".repeat(crate::vocab::forensics::MAX_LINE_BYTES)
        );
        let text = [
            r#"{"schema":"oomguard/1","event":"child_exit","t":1,"pid":7,"code":0}"#,
            "",
            "plain output of the job",
            "[1, 2]",
            r#"{"event":"sample"}"#,
            r#"{"schema":"oomguard/2","event":"sample"}"#,
            &long,
            r#"{"schema":"oomguard/1","event":"from_the_future"}"#,
            r#"{"schema":"oomguard/1","event":"action","action":3}"#,
            r#"{"schema":"oomguard/1","event":"child_exit","pid":7,"pid":8}"#,
            r#"{"schema":"oomguard/1","event":"#,
        ]
        .join("\n");
        let got = items(&text);
        let kinds: Vec<String> = got
            .iter()
            .map(|i| match i {
                Item::Line(l) => match &l.event {
                    Ok(Some(e)) => format!("{}:{}", l.n, e.name()),
                    Ok(None) => format!("{}:unknown", l.n),
                    Err(_) => format!("{}:bad", l.n),
                },
                Item::Skipped { n, why } => format!(
                    "{n}:{}",
                    match why {
                        Skip::TooLong => "long".into(),
                        Skip::NotAnObject => "array".into(),
                        Skip::NotJson { last, .. } => format!("json last={last}"),
                        Skip::NoSchema => "foreign".into(),
                        Skip::OtherSchema(s) => s.clone(),
                    }
                ),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "1:child_exit",
                "3:json last=false",
                "4:array",
                "5:foreign",
                "6:oomguard/2",
                "7:long",
                "8:unknown",
                "9:bad",
                "10:child_exit",
                "11:json last=true",
            ]
        );
        // The key given twice counts once, the last one.
        let Item::Line(l) = &got[8] else { panic!() };
        assert!(matches!(&l.event, Ok(Some(Event::ChildExit(c))) if c.pid == 8));
    }
}
