//! Turning the bytes a terminal sends into key events.
//!
//! The dashboard reads its terminal itself instead of through crossterm's
//! event reader: that reader loops forever on a terminal that has hung up
//! (a read returning 0 or EIO is retried without end), which wedged a run
//! whose SSH connection dropped. Reading ourselves lets a hangup end the
//! read. Only the keys the dashboard uses need to be understood; anything
//! else is skipped.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};

fn key(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
    KeyEvent {
        code,
        modifiers,
        kind: KeyEventKind::Press,
        state: KeyEventState::NONE,
    }
}

/// Parses one read's worth of terminal input. A lone ESC at the end of the
/// input is the Esc key (terminals send a sequence in one write).
pub fn parse(buf: &[u8]) -> Vec<KeyEvent> {
    let none = KeyModifiers::NONE;
    let mut out = Vec::new();
    let mut i = 0;
    while i < buf.len() {
        let b = buf[i];
        match b {
            0x1b => {
                let (ev, used) = escape(&buf[i + 1..]);
                out.extend(ev);
                i += 1 + used;
                continue;
            }
            b'\r' | b'\n' => out.push(key(KeyCode::Enter, none)),
            b'\t' => out.push(key(KeyCode::Tab, none)),
            0x7f | 0x08 => out.push(key(KeyCode::Backspace, none)),
            0x00 => out.push(key(KeyCode::Char(' '), KeyModifiers::CONTROL)),
            0x01..=0x1a => out.push(key(
                KeyCode::Char(char::from(b - 1 + b'a')),
                KeyModifiers::CONTROL,
            )),
            0x1c..=0x1f => {}
            _ => {
                let len = utf8_len(b);
                let end = (i + len).min(buf.len());
                if let Some(c) = std::str::from_utf8(&buf[i..end])
                    .ok()
                    .and_then(|s| s.chars().next())
                {
                    let m = if c.is_uppercase() {
                        KeyModifiers::SHIFT
                    } else {
                        none
                    };
                    out.push(key(KeyCode::Char(c), m));
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    }
}

/// What follows an ESC: the key (if any) and how many bytes it used.
fn escape(rest: &[u8]) -> (Option<KeyEvent>, usize) {
    let none = KeyModifiers::NONE;
    match rest.first() {
        None => (Some(key(KeyCode::Esc, none)), 0),
        Some(b'[') => csi(&rest[1..]).map_or((None, 1), |(k, n)| (k, n + 1)),
        Some(b'O') => match rest.get(1) {
            Some(&c) => (ss3(c), 2),
            None => (None, 1),
        },
        Some(0x1b) => (Some(key(KeyCode::Esc, none)), 0),
        Some(&c) if c.is_ascii_graphic() => (
            Some(key(KeyCode::Char(char::from(c)), KeyModifiers::ALT)),
            1,
        ),
        Some(_) => (Some(key(KeyCode::Esc, none)), 0),
    }
}

/// `ESC O x`: cursor keys in application mode and F1–F4.
fn ss3(c: u8) -> Option<KeyEvent> {
    let code = match c {
        b'A' => KeyCode::Up,
        b'B' => KeyCode::Down,
        b'C' => KeyCode::Right,
        b'D' => KeyCode::Left,
        b'H' => KeyCode::Home,
        b'F' => KeyCode::End,
        b'P'..=b'S' => KeyCode::F(c - b'P' + 1),
        _ => return None,
    };
    Some(key(code, KeyModifiers::NONE))
}

/// `ESC [ params final`. None when the sequence is incomplete (dropped).
fn csi(rest: &[u8]) -> Option<(Option<KeyEvent>, usize)> {
    let end = rest.iter().position(|b| (0x40..=0x7e).contains(b))?;
    let params = std::str::from_utf8(&rest[..end]).unwrap_or("");
    let mut nums = params.split(';').map(|p| p.parse::<u8>().unwrap_or(0));
    let first = nums.next().unwrap_or(0);
    // xterm's modifier parameter: 1 + (shift 1, alt 2, ctrl 4).
    let m = nums.next().unwrap_or(1).saturating_sub(1);
    let mut modifiers = KeyModifiers::NONE;
    if m & 1 != 0 {
        modifiers |= KeyModifiers::SHIFT;
    }
    if m & 2 != 0 {
        modifiers |= KeyModifiers::ALT;
    }
    if m & 4 != 0 {
        modifiers |= KeyModifiers::CONTROL;
    }
    let code = match rest[end] {
        b'A' => Some(KeyCode::Up),
        b'B' => Some(KeyCode::Down),
        b'C' => Some(KeyCode::Right),
        b'D' => Some(KeyCode::Left),
        b'H' => Some(KeyCode::Home),
        b'F' => Some(KeyCode::End),
        b'P'..=b'S' => Some(KeyCode::F(rest[end] - b'P' + 1)),
        b'Z' => {
            modifiers |= KeyModifiers::SHIFT;
            Some(KeyCode::BackTab)
        }
        b'~' => match first {
            1 | 7 => Some(KeyCode::Home),
            2 => Some(KeyCode::Insert),
            3 => Some(KeyCode::Delete),
            4 | 8 => Some(KeyCode::End),
            5 => Some(KeyCode::PageUp),
            6 => Some(KeyCode::PageDown),
            11..=15 => Some(KeyCode::F(first - 10)),
            17..=21 => Some(KeyCode::F(first - 11)),
            _ => None,
        },
        _ => None,
    };
    Some((code.map(|c| key(c, modifiers)), end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(buf: &[u8]) -> Vec<(KeyCode, KeyModifiers)> {
        parse(buf)
            .into_iter()
            .map(|k| (k.code, k.modifiers))
            .collect()
    }

    #[test]
    fn plain_control_and_special_keys() {
        let n = KeyModifiers::NONE;
        assert_eq!(
            codes(b"qp\x03\t\r"),
            vec![
                (KeyCode::Char('q'), n),
                (KeyCode::Char('p'), n),
                (KeyCode::Char('c'), KeyModifiers::CONTROL),
                (KeyCode::Tab, n),
                (KeyCode::Enter, n),
            ]
        );
        assert_eq!(codes(b"\x1b"), vec![(KeyCode::Esc, n)]);
        assert_eq!(codes(b"?"), vec![(KeyCode::Char('?'), n)]);
        assert_eq!(codes("é".as_bytes()), vec![(KeyCode::Char('é'), n)]);
    }

    #[test]
    fn escape_sequences() {
        let n = KeyModifiers::NONE;
        assert_eq!(
            codes(b"\x1b[A\x1b[B\x1bOA\x1b[5~\x1b[6~\x1b[H\x1b[4~\x1bOP"),
            vec![
                (KeyCode::Up, n),
                (KeyCode::Down, n),
                (KeyCode::Up, n),
                (KeyCode::PageUp, n),
                (KeyCode::PageDown, n),
                (KeyCode::Home, n),
                (KeyCode::End, n),
                (KeyCode::F(1), n),
            ]
        );
        assert_eq!(
            codes(b"\x1b[Z"),
            vec![(KeyCode::BackTab, KeyModifiers::SHIFT)]
        );
        assert_eq!(
            codes(b"\x1b[1;5A"),
            vec![(KeyCode::Up, KeyModifiers::CONTROL)]
        );
    }

    #[test]
    fn garbage_never_panics() {
        for buf in [
            &b"\x1b["[..],
            b"\x1b[999999999999~",
            b"\x1bO",
            b"\xff\xfe",
            b"\xe2\x82",
            b"\x1b\x1b\x1b",
        ] {
            let _ = parse(buf);
        }
    }
}
