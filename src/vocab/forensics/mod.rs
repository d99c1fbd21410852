//! Explaining deaths after the fact: kernel OOM reports (`kernel`, read live
//! through `kmsg`) and the job's own PyTorch error messages (`torch`).

pub mod kernel;
pub mod kmsg;
pub mod progress;
pub mod torch;

use std::io::{self, BufRead, Read};

/// The longest line the readers keep: a kernel log line is well under a
/// KiB, an `oomguard/1` log line a few KiB. The rest of a longer line is
/// read and dropped, so one enormous line (`/dev/zero`, a binary file)
/// costs this much memory, not its length.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Reads one line (with its `\n`, if any) into `line`, keeping at most
/// `max` bytes of it. Returns the bytes consumed from `input` (0 at the
/// end) and whether the line was cut.
pub fn read_line_capped(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<(usize, bool)> {
    line.clear();
    let kept = input.by_ref().take(max as u64).read_until(b'\n', line)?;
    if kept < max || line.last() == Some(&b'\n') {
        return Ok((kept, false));
    }
    // Exactly `max` bytes so far: cut only if more than its end follows.
    match input.fill_buf()?.first() {
        None => Ok((kept, false)),
        Some(b'\n') => {
            input.consume(1);
            Ok((kept + 1, false))
        }
        Some(_) => Ok((kept + input.skip_until(b'\n')?, true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_and_the_next_one_read_whole() {
        let text = format!("{}\nnext\nlast", "x".repeat(100));
        let mut input = io::BufReader::with_capacity(16, text.as_bytes());
        let mut line = Vec::new();
        assert_eq!(
            read_line_capped(&mut input, &mut line, 10).unwrap(),
            (101, true)
        );
        assert_eq!(line, b"xxxxxxxxxx");
        assert_eq!(
            read_line_capped(&mut input, &mut line, 10).unwrap(),
            (5, false)
        );
        assert_eq!(line, b"next\n");
        assert_eq!(
            read_line_capped(&mut input, &mut line, 10).unwrap(),
            (4, false)
        );
        assert_eq!(line, b"last");
        assert_eq!(
            read_line_capped(&mut input, &mut line, 10).unwrap(),
            (0, false)
        );
    }

    #[test]
    fn a_line_of_exactly_the_bound_is_not_cut() {
        let mut input = io::BufReader::with_capacity(4, &b"0123456789\nab"[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_line_capped(&mut input, &mut line, 10).unwrap(),
            (11, false)
        );
        assert_eq!(line, b"0123456789");
        assert_eq!(
            read_line_capped(&mut input, &mut line, 2).unwrap(),
            (2, false)
        );
        assert_eq!(line, b"ab");
    }
}
