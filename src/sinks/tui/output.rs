//! The job's output as the dashboard keeps it: a bounded scrollback fed with
//! raw bytes from the job's pty, interpreted by a deliberately small
//! line-oriented terminal.
//!
//! Training jobs print progress bars (tqdm rewrites its line with `\r`,
//! nested bars move the cursor up with `ESC [ A`), coloured log levels and
//! the odd stray escape sequence. What is understood: printable text, `\r`,
//! `\n`, backspace, tab, SGR colours and attributes, erase-in-line and the
//! relative cursor moves. Everything else (OSC titles, cursor addressing,
//! screen clears, DCS strings) is parsed far enough to be dropped. No
//! control character ever reaches the stored text, so nothing the job prints
//! can be replayed to the real terminal, and every buffer is bounded: the
//! number of lines, the length of a line and the length of a pending escape.

use std::collections::VecDeque;

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

/// Default number of lines kept.
pub const DEFAULT_SCROLLBACK: usize = 5000;
/// A line longer than this continues on the next one (a soft wrap), so one
/// endless line cannot grow without bound.
const MAX_COLS: usize = 2000;
/// How far back the cursor may move (`ESC [ A`). Lines older than this are
/// frozen into a compact form.
const HOT_LINES: usize = 32;
/// Parameters of one CSI sequence beyond this are ignored.
const MAX_PARAMS: usize = 16;
/// Tab stops every 8 columns, as terminals have them by default.
const TAB: usize = 8;

/// Colours and attributes in effect for a character (SGR state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pen {
    fg: Option<Color>,
    bg: Option<Color>,
    mods: Modifier,
}

impl Pen {
    /// The ratatui style of text written with this pen.
    pub fn style(self) -> Style {
        let mut s = Style::default().add_modifier(self.mods);
        if let Some(c) = self.fg {
            s = s.fg(c);
        }
        if let Some(c) = self.bg {
            s = s.bg(c);
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Cell {
    ch: char,
    pen: Pen,
}

const BLANK: Cell = Cell {
    ch: ' ',
    pen: Pen {
        fg: None,
        bg: None,
        mods: Modifier::empty(),
    },
};

/// One line: editable cells near the cursor, compact text with style runs
/// once the cursor can no longer reach it.
#[derive(Debug, Clone, Default)]
struct OutLine {
    /// The editable form; empty while the line is frozen.
    cells: Vec<Cell>,
    frozen: Option<Frozen>,
}

/// A line the cursor can no longer reach: plain text and style runs, a
/// fraction of the size of its cells.
#[derive(Debug, Clone)]
struct Frozen {
    text: String,
    /// (number of chars, pen) in order.
    runs: Vec<(u32, Pen)>,
}

impl OutLine {
    fn freeze(&mut self) {
        if self.frozen.is_some() {
            return;
        }
        let cells = std::mem::take(&mut self.cells);
        let mut text = String::with_capacity(cells.len());
        let mut runs: Vec<(u32, Pen)> = Vec::new();
        // Trailing blanks without a background carry no information.
        let end = cells
            .iter()
            .rposition(|c| c.ch != ' ' || c.pen.bg.is_some())
            .map_or(0, |i| i + 1);
        for c in &cells[..end] {
            text.push(c.ch);
            match runs.last_mut() {
                Some((n, pen)) if *pen == c.pen => *n += 1,
                _ => runs.push((1, c.pen)),
            }
        }
        self.frozen = Some(Frozen { text, runs });
    }

    fn cells_mut(&mut self) -> &mut Vec<Cell> {
        if let Some(f) = self.frozen.take() {
            let mut chars = f.text.chars();
            for &(n, pen) in &f.runs {
                for ch in chars.by_ref().take(n as usize) {
                    self.cells.push(Cell { ch, pen });
                }
            }
        }
        &mut self.cells
    }

    /// (char, pen) pairs in order.
    fn for_each(&self, mut f: impl FnMut(char, Pen)) {
        match &self.frozen {
            None => self.cells.iter().for_each(|c| f(c.ch, c.pen)),
            Some(fr) => {
                let mut chars = fr.text.chars();
                for &(n, pen) in &fr.runs {
                    for ch in chars.by_ref().take(n as usize) {
                        f(ch, pen);
                    }
                }
            }
        }
    }

    /// The text without styles, trailing blanks removed.
    fn plain(&self) -> String {
        let mut s = String::new();
        self.for_each(|c, _| s.push(c));
        s.truncate(s.trim_end().len());
        s
    }

    fn is_blank(&self) -> bool {
        match &self.frozen {
            None => self.cells.iter().all(|c| c.ch == ' ' && c.pen.bg.is_none()),
            Some(fr) => fr.text.trim().is_empty(),
        }
    }
}

/// Where the escape-sequence parser is.
#[derive(Debug, Clone, PartialEq)]
enum Parse {
    Ground,
    /// After ESC.
    Esc,
    /// After ESC and an intermediate byte (`ESC ( B`): one more byte.
    EscIntermediate,
    /// Inside `ESC [`: parameters so far, whether a private marker was seen.
    Csi {
        params: Vec<u16>,
        cur: Option<u16>,
        private: bool,
    },
    /// Inside an OSC/DCS/APC/PM/SOS string: dropped until BEL or ST.
    Str,
    /// ESC seen inside such a string (maybe the start of ST).
    StrEsc,
}

/// The job's output: a bounded list of lines and a cursor.
#[derive(Debug, Clone)]
pub struct OutputBuffer {
    lines: VecDeque<OutLine>,
    max_lines: usize,
    /// Cursor row, an index into `lines`.
    row: usize,
    col: usize,
    pen: Pen,
    parse: Parse,
    /// A UTF-8 sequence split across chunks.
    utf8: [u8; 4],
    utf8_len: usize,
    utf8_need: usize,
    /// Lines ever started (including dropped ones): lets a scrolled view
    /// stay anchored while output arrives.
    total: u64,
}

impl Default for OutputBuffer {
    fn default() -> Self {
        Self::new(DEFAULT_SCROLLBACK)
    }
}

impl OutputBuffer {
    /// A buffer that keeps at most `max_lines` lines (at least `HOT_LINES`).
    pub fn new(max_lines: usize) -> Self {
        let mut lines = VecDeque::new();
        lines.push_back(OutLine::default());
        Self {
            lines,
            max_lines: max_lines.max(HOT_LINES + 1),
            row: 0,
            col: 0,
            pen: Pen::default(),
            parse: Parse::Ground,
            utf8: [0; 4],
            utf8_len: 0,
            utf8_need: 0,
            total: 1,
        }
    }

    /// Number of lines shown. A trailing empty line where the cursor waits
    /// for the next output is not counted.
    pub fn len(&self) -> usize {
        let n = self.lines.len();
        if n > 0 && self.row == n - 1 && self.lines[n - 1].is_blank() {
            n - 1
        } else {
            n
        }
    }

    /// Whether nothing visible has been printed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lines ever started, including those dropped from the scrollback.
    pub fn total_lines(&self) -> u64 {
        self.total
    }

    /// Line `i` (0 = oldest kept) as plain text, trailing blanks removed.
    pub fn plain_line(&self, i: usize) -> Option<String> {
        self.lines.get(i).map(OutLine::plain)
    }

    /// Line `i` as styled spans, adjacent characters of one pen merged.
    pub fn styled_line(&self, i: usize) -> Line<'static> {
        let Some(line) = self.lines.get(i) else {
            return Line::default();
        };
        let mut spans: Vec<Span<'static>> = Vec::new();
        let mut cur = String::new();
        let mut cur_pen: Option<Pen> = None;
        line.for_each(|ch, pen| {
            if cur_pen != Some(pen) {
                if let Some(p) = cur_pen
                    && !cur.is_empty()
                {
                    spans.push(Span::styled(std::mem::take(&mut cur), p.style()));
                }
                cur_pen = Some(pen);
            }
            cur.push(ch);
        });
        if let Some(p) = cur_pen {
            let trimmed = if p.bg.is_none() { cur.trim_end() } else { &cur };
            if !trimmed.is_empty() {
                spans.push(Span::styled(trimmed.to_string(), p.style()));
            }
        }
        Line::from(spans)
    }

    /// Feeds raw bytes as the job wrote them. Chunks may split UTF-8
    /// characters and escape sequences anywhere.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.utf8_need > 0 {
                if b & 0xC0 == 0x80 {
                    self.utf8[self.utf8_len] = b;
                    self.utf8_len += 1;
                    if self.utf8_len == self.utf8_need {
                        let ch = std::str::from_utf8(&self.utf8[..self.utf8_len])
                            .ok()
                            .and_then(|s| s.chars().next())
                            .unwrap_or(char::REPLACEMENT_CHARACTER);
                        self.utf8_need = 0;
                        self.utf8_len = 0;
                        self.on_char(ch);
                    }
                    continue;
                }
                // A truncated sequence: show that something was lost, then
                // handle this byte afresh.
                self.utf8_need = 0;
                self.utf8_len = 0;
                self.on_char(char::REPLACEMENT_CHARACTER);
            }
            match b {
                0x00..=0x7F => self.on_char(char::from(b)),
                0xC2..=0xDF => self.start_utf8(b, 2),
                0xE0..=0xEF => self.start_utf8(b, 3),
                0xF0..=0xF4 => self.start_utf8(b, 4),
                _ => self.on_char(char::REPLACEMENT_CHARACTER),
            }
        }
    }

    fn start_utf8(&mut self, b: u8, need: usize) {
        self.utf8[0] = b;
        self.utf8_len = 1;
        self.utf8_need = need;
    }

    fn on_char(&mut self, ch: char) {
        match std::mem::replace(&mut self.parse, Parse::Ground) {
            Parse::Ground => self.ground(ch),
            Parse::Esc => self.esc(ch),
            Parse::EscIntermediate => {}
            Parse::Csi {
                params,
                cur,
                private,
            } => self.csi(ch, params, cur, private),
            Parse::Str => match ch {
                '\x07' | '\u{9c}' => {}
                '\x1b' => self.parse = Parse::StrEsc,
                _ => self.parse = Parse::Str,
            },
            Parse::StrEsc => {
                if ch != '\\' {
                    self.parse = Parse::Str;
                }
            }
        }
    }

    fn ground(&mut self, ch: char) {
        match ch {
            '\x1b' => self.parse = Parse::Esc,
            '\n' | '\x0b' | '\x0c' => self.line_feed(),
            '\r' => self.col = 0,
            '\x08' => self.col = self.col.saturating_sub(1),
            '\t' => {
                let next = (self.col / TAB + 1) * TAB;
                self.col = next.min(MAX_COLS - 1);
            }
            // C1 control introducer as a character.
            '\u{9b}' => {
                self.parse = Parse::Csi {
                    params: Vec::new(),
                    cur: None,
                    private: false,
                }
            }
            '\u{90}' | '\u{9d}' | '\u{9e}' | '\u{9f}' | '\u{98}' => self.parse = Parse::Str,
            c if c.is_control() => {}
            c => self.put(c),
        }
    }

    fn esc(&mut self, ch: char) {
        match ch {
            '[' => {
                self.parse = Parse::Csi {
                    params: Vec::new(),
                    cur: None,
                    private: false,
                }
            }
            ']' | 'P' | 'X' | '^' | '_' => self.parse = Parse::Str,
            // Charset designation and the like: one more byte to swallow.
            ' '..='/' => self.parse = Parse::EscIntermediate,
            // Reverse index: the line above.
            'M' => self.row = self.row.saturating_sub(1).max(self.hot_start()),
            'E' => {
                self.line_feed();
                self.col = 0;
            }
            'c' => self.pen = Pen::default(),
            // A stray ESC before an ordinary character: drop both.
            _ => {}
        }
    }

    fn csi(&mut self, ch: char, mut params: Vec<u16>, mut cur: Option<u16>, mut private: bool) {
        match ch {
            '0'..='9' => {
                let d = ch as u16 - '0' as u16;
                cur = Some(cur.unwrap_or(0).saturating_mul(10).saturating_add(d));
            }
            ';' | ':' => {
                if params.len() < MAX_PARAMS {
                    params.push(cur.unwrap_or(0));
                }
                cur = None;
            }
            '<'..='?' => private = true,
            // Intermediate bytes: keep parsing.
            ' '..='/' => {}
            '@'..='~' => {
                if let Some(c) = cur
                    && params.len() < MAX_PARAMS
                {
                    params.push(c);
                }
                if !private {
                    self.csi_final(ch, &params);
                }
                return;
            }
            // Anything else aborts the sequence (as terminals do).
            _ => return,
        }
        self.parse = Parse::Csi {
            params,
            cur,
            private,
        };
    }

    fn csi_final(&mut self, ch: char, params: &[u16]) {
        let n = params.first().copied().unwrap_or(0).max(1) as usize;
        match ch {
            'm' => self.sgr(params),
            'K' => self.erase_in_line(params.first().copied().unwrap_or(0)),
            'A' => self.row = self.row.saturating_sub(n).max(self.hot_start()),
            'B' => self.row = (self.row + n).min(self.lines.len() - 1),
            'C' => self.col = (self.col + n).min(MAX_COLS - 1),
            'D' => self.col = self.col.saturating_sub(n),
            'G' | '`' => self.col = (n - 1).min(MAX_COLS - 1),
            'E' => {
                self.row = (self.row + n).min(self.lines.len() - 1);
                self.col = 0;
            }
            'F' => {
                self.row = self.row.saturating_sub(n).max(self.hot_start());
                self.col = 0;
            }
            // Cursor addressing and screen clears belong to full-screen
            // programs; a scrollback keeps its history instead.
            _ => {}
        }
    }

    fn sgr(&mut self, params: &[u16]) {
        if params.is_empty() {
            self.pen = Pen::default();
            return;
        }
        let mut i = 0;
        while i < params.len() {
            let p = params[i];
            match p {
                0 => self.pen = Pen::default(),
                1 => self.pen.mods.insert(Modifier::BOLD),
                2 => self.pen.mods.insert(Modifier::DIM),
                3 => self.pen.mods.insert(Modifier::ITALIC),
                4 => self.pen.mods.insert(Modifier::UNDERLINED),
                5 | 6 => self.pen.mods.insert(Modifier::SLOW_BLINK),
                7 => self.pen.mods.insert(Modifier::REVERSED),
                9 => self.pen.mods.insert(Modifier::CROSSED_OUT),
                22 => self.pen.mods.remove(Modifier::BOLD | Modifier::DIM),
                23 => self.pen.mods.remove(Modifier::ITALIC),
                24 => self.pen.mods.remove(Modifier::UNDERLINED),
                25 => self.pen.mods.remove(Modifier::SLOW_BLINK),
                27 => self.pen.mods.remove(Modifier::REVERSED),
                29 => self.pen.mods.remove(Modifier::CROSSED_OUT),
                30..=37 => self.pen.fg = Some(basic(p - 30, false)),
                39 => self.pen.fg = None,
                40..=47 => self.pen.bg = Some(basic(p - 40, false)),
                49 => self.pen.bg = None,
                90..=97 => self.pen.fg = Some(basic(p - 90, true)),
                100..=107 => self.pen.bg = Some(basic(p - 100, true)),
                38 | 48 => {
                    let (color, used) = extended(&params[i + 1..]);
                    if let Some(c) = color {
                        if p == 38 {
                            self.pen.fg = Some(c);
                        } else {
                            self.pen.bg = Some(c);
                        }
                    }
                    i += used;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn erase_in_line(&mut self, mode: u16) {
        let col = self.col;
        let cells = self.lines[self.row].cells_mut();
        match mode {
            0 => cells.truncate(col),
            1 => {
                let end = (col + 1).min(cells.len());
                cells[..end].fill(BLANK);
            }
            2 => cells.clear(),
            _ => {}
        }
    }

    /// Oldest row the cursor may move up to.
    fn hot_start(&self) -> usize {
        self.lines.len().saturating_sub(HOT_LINES)
    }

    fn put(&mut self, ch: char) {
        if self.col >= MAX_COLS {
            self.line_feed();
        }
        let (col, pen) = (self.col, self.pen);
        let cells = self.lines[self.row].cells_mut();
        if cells.len() < col {
            cells.resize(col, BLANK);
        }
        if col < cells.len() {
            cells[col] = Cell { ch, pen };
        } else {
            cells.push(Cell { ch, pen });
        }
        self.col += 1;
    }

    /// Moves to the start of the next line, creating it at the bottom.
    /// (The job's pty turns `\n` into `\r\n`; a bare `\n` from a pipe
    /// should also start at column 0, as users expect.)
    fn line_feed(&mut self) {
        self.col = 0;
        if self.row + 1 < self.lines.len() {
            self.row += 1;
            return;
        }
        self.lines.push_back(OutLine::default());
        self.total += 1;
        self.row = self.lines.len() - 1;
        let freeze_at = self.lines.len().saturating_sub(HOT_LINES + 1);
        if let Some(old) = self.lines.get_mut(freeze_at) {
            old.freeze();
        }
        // One more than the limit: the line the cursor waits on.
        while self.lines.len() > self.max_lines + 1 {
            self.lines.pop_front();
            self.row = self.row.saturating_sub(1);
        }
    }
}

fn basic(i: u16, bright: bool) -> Color {
    match (i, bright) {
        (0, false) => Color::Black,
        (1, false) => Color::Red,
        (2, false) => Color::Green,
        (3, false) => Color::Yellow,
        (4, false) => Color::Blue,
        (5, false) => Color::Magenta,
        (6, false) => Color::Cyan,
        (7, false) => Color::Gray,
        (0, true) => Color::DarkGray,
        (1, true) => Color::LightRed,
        (2, true) => Color::LightGreen,
        (3, true) => Color::LightYellow,
        (4, true) => Color::LightBlue,
        (5, true) => Color::LightMagenta,
        (6, true) => Color::LightCyan,
        _ => Color::White,
    }
}

/// `5;N` (indexed) or `2;R;G;B` after a 38/48: the colour and how many
/// parameters it used.
fn extended(rest: &[u16]) -> (Option<Color>, usize) {
    let byte = |i: usize| rest.get(i).map(|&v| v.min(255) as u8);
    match rest.first() {
        Some(5) => (byte(1).map(Color::Indexed), 2),
        Some(2) => match (byte(1), byte(2), byte(3)) {
            (Some(r), Some(g), Some(b)) => (Some(Color::Rgb(r, g, b)), 4),
            _ => (None, rest.len()),
        },
        _ => (None, rest.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(o: &OutputBuffer) -> Vec<String> {
        (0..o.len()).map(|i| o.plain_line(i).unwrap()).collect()
    }

    #[test]
    fn plain_lines_and_crlf() {
        let mut o = OutputBuffer::default();
        o.feed(b"hello\r\nworld\n");
        assert_eq!(lines(&o), ["hello", "world"]);
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn carriage_return_rewrites_like_tqdm() {
        let mut o = OutputBuffer::default();
        o.feed(b"epoch 1:  10%|#         | 1/10\r");
        o.feed(b"epoch 1:  50%|#####     | 5/10\r");
        o.feed(b"epoch 1: 100%|##########| 10/10\r\ndone\r\n");
        assert_eq!(lines(&o), ["epoch 1: 100%|##########| 10/10", "done"]);
    }

    #[test]
    fn shorter_rewrite_leaves_the_tail_as_a_terminal_does() {
        let mut o = OutputBuffer::default();
        o.feed(b"abcdef\rxy");
        assert_eq!(lines(&o), ["xycdef"]);
        o.feed(b"\x1b[K");
        assert_eq!(lines(&o), ["xy"]);
    }

    #[test]
    fn nested_bars_move_up() {
        let mut o = OutputBuffer::default();
        o.feed(b"outer 0%\r\ninner 0%\r\n");
        o.feed(b"\x1b[2A\router 50%\x1b[K\r\ninner 90%\x1b[K\r\n");
        assert_eq!(lines(&o), ["outer 50%", "inner 90%"]);
    }

    #[test]
    fn colours_are_kept_as_styles_and_escapes_never_stored() {
        let mut o = OutputBuffer::default();
        o.feed(b"\x1b[1;31mERROR\x1b[0m plain \x1b[38;5;208mamber\x1b[39m \x1b[38;2;1;2;3mrgb\x1b[m\r\n");
        assert_eq!(lines(&o), ["ERROR plain amber rgb"]);
        let line = o.styled_line(0);
        assert_eq!(line.spans[0].content, "ERROR");
        assert_eq!(line.spans[0].style.fg, Some(Color::Red));
        assert!(line.spans[0].style.add_modifier.contains(Modifier::BOLD));
        assert_eq!(line.spans[1].content, " plain ");
        assert_eq!(line.spans[1].style, Style::default());
        assert_eq!(line.spans[2].style.fg, Some(Color::Indexed(208)));
        assert_eq!(line.spans[4].style.fg, Some(Color::Rgb(1, 2, 3)));
    }

    #[test]
    fn other_sequences_are_dropped() {
        let mut o = OutputBuffer::default();
        // Title (OSC with BEL and with ST), cursor addressing, clear
        // screen, private modes, charset, DCS, bell, NUL.
        o.feed(b"\x1b]0;title\x07a\x1b]2;t\x1b\\b\x1b[2J\x1b[H\x1b[?25lc\x1b(Bd\x1bPq#0\x1b\\e\x07\x00f");
        assert_eq!(lines(&o), ["abcdef"]);
    }

    #[test]
    fn split_chunks_and_utf8() {
        let mut o = OutputBuffer::default();
        let text = "é → 日本\x1b[32mgreen\x1b[0m\r\n".as_bytes();
        for b in text {
            o.feed(std::slice::from_ref(b));
        }
        assert_eq!(lines(&o), ["é → 日本green"]);
        o.feed(&[0xff, b'x', 0xe6, b'y', b'\n']);
        assert_eq!(o.plain_line(1).unwrap(), "\u{fffd}x\u{fffd}y");
    }

    #[test]
    fn tabs_and_backspace() {
        let mut o = OutputBuffer::default();
        o.feed(b"a\tb\x08c\n");
        assert_eq!(lines(&o), ["a       c"]);
    }

    #[test]
    fn scrollback_is_bounded_and_cold_lines_survive() {
        let mut o = OutputBuffer::new(100);
        for i in 0..1000 {
            o.feed(format!("\x1b[33mline {i}\x1b[0m\r\n").as_bytes());
        }
        assert_eq!(o.len(), 100);
        assert_eq!(o.plain_line(0).unwrap(), "line 900");
        assert_eq!(o.plain_line(99).unwrap(), "line 999");
        assert_eq!(o.styled_line(0).spans[0].style.fg, Some(Color::Yellow));
        assert_eq!(o.total_lines(), 1001);
    }

    #[test]
    fn cursor_up_stops_at_the_hot_region() {
        let mut o = OutputBuffer::new(1000);
        for i in 0..100 {
            o.feed(format!("{i}\n").as_bytes());
        }
        o.feed(b"\x1b[500Ax");
        // Moved up only as far as the editable lines reach.
        assert_eq!(o.plain_line(100 - HOT_LINES + 1).unwrap(), "x9");
        assert_eq!(o.plain_line(0).unwrap(), "0");
    }

    #[test]
    fn endless_line_and_unterminated_escape_are_bounded() {
        let mut o = OutputBuffer::default();
        o.feed(&vec![b'x'; MAX_COLS * 3]);
        assert_eq!(o.len(), 3);
        o.feed(b"\x1b]");
        o.feed(&vec![b'y'; 100_000]);
        assert_eq!(o.len(), 3);
        o.feed(b"\x07ok");
        assert_eq!(o.plain_line(3).unwrap(), "ok");
        // Huge numeric parameters saturate.
        o.feed(b"\x1b[99999999999999999999C!");
        assert_eq!(o.plain_line(3).unwrap().chars().last(), Some('!'));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_safe(chunks in proptest::collection::vec(
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), 0..20)
        ) {
            let mut o = OutputBuffer::new(50);
            for c in &chunks {
                o.feed(c);
            }
            proptest::prop_assert!(o.len() <= 51);
            for i in 0..o.len() {
                let line = o.styled_line(i);
                for span in &line.spans {
                    proptest::prop_assert!(
                        !span.content.chars().any(char::is_control),
                        "control character stored: {:?}", span.content
                    );
                }
            }
        }

        #[test]
        fn escape_heavy_input_is_safe(parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::prelude::Just(b"\x1b[".to_vec()),
                proptest::prelude::Just(b"\x1b]".to_vec()),
                proptest::prelude::Just(b"\r".to_vec()),
                proptest::prelude::Just(b"\n".to_vec()),
                proptest::prelude::Just(b"\x08".to_vec()),
                proptest::prelude::Just(b"\x07".to_vec()),
                proptest::prelude::Just(b";".to_vec()),
                proptest::prelude::Just(b"38;5;".to_vec()),
                proptest::prelude::Just(b"9999999".to_vec()),
                proptest::prelude::Just(b"A".to_vec()),
                proptest::prelude::Just(b"K".to_vec()),
                proptest::prelude::Just(b"m".to_vec()),
                proptest::prelude::Just("é日".as_bytes().to_vec()),
            ], 0..300)
        ) {
            let mut o = OutputBuffer::new(40);
            for p in &parts {
                o.feed(p);
            }
            for i in 0..o.len() {
                let text = o.plain_line(i).unwrap_or_default();
                proptest::prop_assert!(!text.chars().any(char::is_control));
            }
        }
    }
}
