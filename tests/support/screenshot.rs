//! Screenshots of HTML pages with headless Chromium, and a small PNG
//! decoder (zlib inflate + row filters) so tests can look at the pixels
//! without an image crate.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The page's DOM after Chromium ran it, and whether its console logged an
/// error.
pub fn dump_dom(chrome: &Path, html: &Path) -> (String, bool) {
    let out = headless(
        chrome,
        html,
        &["--enable-logging=stderr", "--v=0", "--dump-dom"],
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chromium failed ({}): {log}",
        out.status
    );
    let errors = log
        .lines()
        .any(|l| l.contains("CONSOLE") && l.contains("ERROR"));
    (String::from_utf8_lossy(&out.stdout).into_owned(), errors)
}

/// The Chromium binary, if installed (Debian's `chromium`).
pub fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Renders `html` at `width`×`height` CSS pixels into `png`.
pub fn screenshot(chrome: &Path, html: &Path, png: &Path, width: u32, height: u32) {
    let _ = std::fs::remove_file(png);
    let out = headless(
        chrome,
        html,
        &[
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            &format!("--window-size={width},{height}"),
            &format!("--screenshot={}", png.display()),
        ],
    );
    assert!(
        out.status.success() && png.exists(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Headless Chromium on `html` with `args`, its output, within 90 s (the
/// DOM dump had no deadline, and a failure showed only as a DOM without
/// the finding). It runs offline (no network, no first-run work) with a
/// throwaway profile, so that nothing from an earlier run is read.
fn headless(chrome: &Path, html: &Path, args: &[&str]) -> std::process::Output {
    // Chromium keeps a core busy for seconds.
    let _lock = crate::common::machine::beside();
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
        ])
        .args(args)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", html.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained as it runs: a page's DOM can outgrow the pipe.
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn drain(mut from: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = from.read_to_end(&mut all);
        all
    })
}

/// A decoded RGB(A) image.
pub struct Image {
    pub width: u32,
    pub height: u32,
    /// Always RGB, 3 bytes per pixel.
    pub rgb: Vec<u8>,
}

impl Image {
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * self.width + x) * 3) as usize;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// Pixels within `tol` (per channel) of `c`.
    pub fn count_near(&self, c: [u8; 3], tol: u8) -> usize {
        self.rgb
            .chunks_exact(3)
            .filter(|p| (0..3).all(|k| p[k].abs_diff(c[k]) <= tol))
            .count()
    }

    /// Distinct colours (capped scan: every pixel, counted in a set).
    pub fn distinct_colours(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        for p in self.rgb.chunks_exact(3) {
            seen.insert([p[0], p[1], p[2]]);
        }
        seen.len()
    }
}

/// Only the IHDR: (width, height, bit depth, colour type).
pub fn png_header(bytes: &[u8]) -> Result<(u32, u32, u8, u8), String> {
    const SIG: [u8; 8] = [137, 80, 78, 71, 13, 10, 26, 10];
    if bytes.len() < 33 || bytes[..8] != SIG {
        return Err("not a PNG".into());
    }
    if &bytes[12..16] != b"IHDR" {
        return Err("first chunk is not IHDR".into());
    }
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok((be(16), be(20), bytes[24], bytes[25]))
}

/// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes).
pub fn decode_png(bytes: &[u8]) -> Result<Image, String> {
    let (width, height, depth, colour) = png_header(bytes)?;
    let channels = match colour {
        2 => 3,
        6 => 4,
        c => return Err(format!("colour type {c} not supported")),
    };
    if depth != 8 || bytes[28] != 0 {
        return Err("only 8-bit non-interlaced PNGs are supported".into());
    }
    let mut idat = Vec::new();
    let mut i = 8;
    while i + 8 <= bytes.len() {
        let len = u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]) as usize;
        let kind = &bytes[i + 4..i + 8];
        let data = bytes
            .get(i + 8..i + 8 + len)
            .ok_or("chunk runs past the end")?;
        if kind == b"IDAT" {
            idat.extend_from_slice(data);
        }
        if kind == b"IEND" {
            break;
        }
        i += 12 + len;
    }
    if idat.len() < 2 {
        return Err("no image data".into());
    }
    let raw = inflate(&idat[2..])?;
    let stride = width as usize * channels;
    if raw.len() < (stride + 1) * height as usize {
        return Err(format!("image data too short: {}", raw.len()));
    }
    let mut cur = vec![0u8; stride];
    let mut prev = vec![0u8; stride];
    let mut rgb = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height as usize {
        let row = &raw[y * (stride + 1)..(y + 1) * (stride + 1)];
        let filter = row[0];
        for x in 0..stride {
            let a = if x >= channels { cur[x - channels] } else { 0 };
            let b = prev[x];
            let c = if x >= channels { prev[x - channels] } else { 0 };
            let pred = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => paeth(a, b, c),
                f => return Err(format!("bad filter {f} in row {y}")),
            };
            cur[x] = row[x + 1].wrapping_add(pred);
        }
        for px in cur.chunks_exact(channels) {
            rgb.extend_from_slice(&px[..3]);
        }
        std::mem::swap(&mut cur, &mut prev);
    }
    Ok(Image { width, height, rgb })
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// Reads bits least-significant first, as DEFLATE stores them.
struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
    bit: u32,
}

impl Bits<'_> {
    fn get(&mut self, n: u32) -> Result<u32, String> {
        let mut v = 0;
        for i in 0..n {
            let byte = *self.data.get(self.pos).ok_or("deflate stream ends early")?;
            v |= u32::from((byte >> self.bit) & 1) << i;
            self.bit += 1;
            if self.bit == 8 {
                self.bit = 0;
                self.pos += 1;
            }
        }
        Ok(v)
    }

    fn align(&mut self) {
        if self.bit > 0 {
            self.bit = 0;
            self.pos += 1;
        }
    }
}

/// A canonical Huffman code: counts per length and symbols in code order.
struct Huffman {
    counts: [u16; 16],
    symbols: Vec<u16>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Self {
        let mut counts = [0u16; 16];
        for &l in lengths {
            counts[l as usize] += 1;
        }
        counts[0] = 0;
        let mut offs = [0u16; 16];
        for i in 1..16 {
            offs[i] = offs[i - 1] + counts[i - 1];
        }
        let mut symbols = vec![0u16; lengths.len()];
        for (s, &l) in lengths.iter().enumerate() {
            if l != 0 {
                symbols[offs[l as usize] as usize] = s as u16;
                offs[l as usize] += 1;
            }
        }
        Self { counts, symbols }
    }

    fn decode(&self, bits: &mut Bits<'_>) -> Result<u16, String> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..16 {
            code |= bits.get(1)? as i32;
            let count = i32::from(self.counts[len]);
            if code - count < first {
                return Ok(self.symbols[(index + (code - first)) as usize]);
            }
            index += count;
            first += count;
            first <<= 1;
            code <<= 1;
        }
        Err("bad Huffman code".into())
    }
}

const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// Raw DEFLATE (RFC 1951) decoder: stored, fixed and dynamic blocks.
pub fn inflate(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut bits = Bits {
        data,
        pos: 0,
        bit: 0,
    };
    let mut out: Vec<u8> = Vec::new();
    loop {
        let last = bits.get(1)?;
        match bits.get(2)? {
            0 => {
                bits.align();
                let p = bits.pos;
                let len = u16::from_le_bytes([data[p], data[p + 1]]) as usize;
                out.extend_from_slice(data.get(p + 4..p + 4 + len).ok_or("stored block")?);
                bits.pos = p + 4 + len;
            }
            1 => {
                let mut l = [0u8; 288];
                l[..144].fill(8);
                l[144..256].fill(9);
                l[256..280].fill(7);
                l[280..].fill(8);
                block(
                    &mut bits,
                    &mut out,
                    &Huffman::new(&l),
                    &Huffman::new(&[5; 30]),
                )?;
            }
            2 => {
                let hlit = bits.get(5)? as usize + 257;
                let hdist = bits.get(5)? as usize + 1;
                let hclen = bits.get(4)? as usize + 4;
                const ORDER: [usize; 19] = [
                    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
                ];
                let mut cl = [0u8; 19];
                for &o in ORDER.iter().take(hclen) {
                    cl[o] = bits.get(3)? as u8;
                }
                let clh = Huffman::new(&cl);
                let mut lens = Vec::with_capacity(hlit + hdist);
                while lens.len() < hlit + hdist {
                    let sym = clh.decode(&mut bits)?;
                    match sym {
                        0..=15 => lens.push(sym as u8),
                        16 => {
                            let prev = *lens.last().ok_or("repeat with no length")?;
                            for _ in 0..3 + bits.get(2)? {
                                lens.push(prev);
                            }
                        }
                        17 => lens.extend(std::iter::repeat_n(0, 3 + bits.get(3)? as usize)),
                        _ => lens.extend(std::iter::repeat_n(0, 11 + bits.get(7)? as usize)),
                    }
                }
                block(
                    &mut bits,
                    &mut out,
                    &Huffman::new(&lens[..hlit]),
                    &Huffman::new(&lens[hlit..]),
                )?;
            }
            _ => return Err("reserved block type".into()),
        }
        if last == 1 {
            return Ok(out);
        }
    }
}

fn block(
    bits: &mut Bits<'_>,
    out: &mut Vec<u8>,
    lit: &Huffman,
    dist: &Huffman,
) -> Result<(), String> {
    loop {
        let sym = lit.decode(bits)? as usize;
        if sym < 256 {
            out.push(sym as u8);
        } else if sym == 256 {
            return Ok(());
        } else {
            let i = sym - 257;
            let len = *LEN_BASE.get(i).ok_or("bad length")? as usize
                + bits.get(u32::from(LEN_EXTRA[i]))? as usize;
            let d = dist.decode(bits)? as usize;
            let back = *DIST_BASE.get(d).ok_or("bad distance")? as usize
                + bits.get(u32::from(DIST_EXTRA[d]))? as usize;
            if back > out.len() {
                return Err("distance before the start".into());
            }
            let start = out.len() - back;
            for k in 0..len {
                let b = out[start + k];
                out.push(b);
            }
        }
    }
}
