//! A format 2 directory's hash over its text: the taps' lines in byte
//! order, each ordered by its first 16 bytes as a number where those
//! differ (lines of one stage share its name, so comparing them byte by
//! byte from their start was most of the sort).

/// A line of a directory's text, with its first 16 bytes as a number.
pub(crate) struct Line {
    prefix: u128,
    start: usize,
    end: usize,
}

impl Line {
    /// The line from `start` to the end of `text`.
    pub(crate) fn new(text: &[u8], start: usize) -> Line {
        let mut first = [0u8; 16];
        let n = (text.len() - start).min(16);
        first[..n].copy_from_slice(&text[start..start + n]);
        Line {
            prefix: u128::from_be_bytes(first),
            start,
            end: text.len(),
        }
    }

    /// Byte order of the lines. A shorter line's prefix is padded with
    /// zeros: an order of prefixes is the order of the lines, and where
    /// the prefixes are equal the bytes after them decide (all of the
    /// bytes where a line is shorter than its prefix).
    fn cmp(&self, other: &Line, text: &[u8]) -> std::cmp::Ordering {
        let whole = self.end - self.start >= 16 && other.end - other.start >= 16;
        let skip = if whole { 16 } else { 0 };
        (self.prefix.cmp(&other.prefix)).then_with(|| {
            text[self.start + skip..self.end].cmp(&text[other.start + skip..other.end])
        })
    }
}

/// The hash of a directory whose text holds `lines` (in any order): its
/// header, then the lines in byte order.
pub(crate) fn hash(text: &[u8], mut lines: Vec<Line>) -> String {
    lines.sort_unstable_by(|a, b| a.cmp(b, text));
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"taptree dir v2\n");
    // Hashed a batch of lines at a time: each update still hashes many
    // blake3 chunks at once.
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    for line in lines {
        batch.extend_from_slice(&text[line.start..line.end]);
        if batch.len() >= 60 * 1024 {
            hasher.update(&batch);
            batch.clear();
        }
    }
    hasher.update(&batch);
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines ordered by their prefixes are in byte order: lines of 15, 16
    /// and 17 bytes, a zero byte, and prefixes that tie.
    #[test]
    fn lines_by_prefix_are_in_byte_order() {
        let words: [&[u8]; 9] = [
            b"",
            b"a",
            b"a\0",
            b"abcdefghijklmno",
            b"abcdefghijklmnop",
            b"abcdefghijklmnop\0",
            b"abcdefghijklmnopq",
            b"abcdefghijklmnoq",
            b"b",
        ];
        let (mut text, mut lines) = (Vec::new(), Vec::new());
        for w in words.iter().rev().chain(&words) {
            let start = text.len();
            text.extend_from_slice(w);
            lines.push(Line::new(&text, start));
        }
        lines.sort_unstable_by(|a, b| a.cmp(b, &text));
        let sorted: Vec<&[u8]> = lines.iter().map(|l| &text[l.start..l.end]).collect();
        let mut want: Vec<&[u8]> = words.iter().chain(&words).copied().collect();
        want.sort();
        assert_eq!(sorted, want);
    }
}
