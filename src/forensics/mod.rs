//! Explaining deaths after the fact: kernel OOM reports (`kernel`, read live
//! through `kmsg`) and the job's own PyTorch error messages (`torch`).

pub mod kernel;
pub mod kmsg;
pub mod progress;
pub mod torch;

use std::io::{self, BufRead};

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
    let (mut consumed, mut cut) = (0, false);
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok((consumed, cut));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(line.len());
        line.extend_from_slice(&buf[..take.min(room)]);
        cut |= take > room;
        input.consume(take);
        consumed += take;
        if done {
            return Ok((consumed, cut));
        }
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
}
