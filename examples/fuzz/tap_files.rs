//! The `tree` target's edits that write tap files: an edited entry's file
//! written again to match it, a tap's rows split between two taps, a
//! tensor's shards cut again. Each file is written as a writer writes it
//! (`capture::tapfile::encode_header`, then the tensor), and its entry's
//! hashes and byte count made to match, so that no hash or header check is
//! left to catch the edit: only what reads the tree's meaning can.

use crate::hostile::{elements, Editor};
use capture::manifest;
use capture::{Entry, Shard};

/// The largest tap file an edit writes.
const MOST_WRITTEN: usize = 1 << 22;

impl Editor<'_> {
    /// Half the time, axis 0 made the entry's positions and its byte count
    /// its shape's; then, half the time, its tap file written to match.
    pub(crate) fn maybe_consistent(&mut self, i: usize) -> &'static str {
        if self.rng.bool() {
            return "";
        }
        let e = &mut self.m.entries[i];
        let rows = e.key.pos.end.saturating_sub(e.key.pos.start) as usize;
        match e.shape.first_mut() {
            Some(r) => *r = rows,
            None => e.shape = vec![rows],
        }
        if let Some(n) = elements(&e.shape).and_then(|n| n.checked_mul(e.dtype.size())) {
            e.bytes = n as u64;
        }
        if self.rng.bool() && self.rewrite(i) {
            ", made consistent, tap file written"
        } else {
            ", made consistent"
        }
    }

    /// Writes entry `i`'s tap file again to match its key, dtype and shape
    /// (at the path a writer gives its key), and its hashes and byte count
    /// to match the file: false where the tensor is too large to write or
    /// the stage name no file may carry.
    pub(crate) fn rewrite(&mut self, i: usize) -> bool {
        let e = &self.m.entries[i];
        let Some(len) = elements(&e.shape).and_then(|n| n.checked_mul(e.dtype.size())) else {
            return false;
        };
        if len > MOST_WRITTEN || !manifest::valid_stage_name(&e.key.stage) {
            return false;
        }
        // The old tensor's bytes, repeated, or random ones (NaNs and all).
        let old = self
            .data(e)
            .filter(|d| !d.is_empty() && self.rng.u8(..4) != 0);
        let data: Vec<u8> = match old {
            Some(d) => d.iter().copied().cycle().take(len).collect(),
            None => (0..len).map(|_| self.rng.u8(..)).collect(),
        };
        self.write(i, &data);
        true
    }

    /// An entry of several positions written as two taps, their rows
    /// split between them (as a decode writes what a prefill writes in
    /// one), their positions sometimes overlapping or leaving a gap.
    pub(crate) fn split_rows(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let e = self.m.entries[i].clone();
        let rows = e.key.rows();
        let Some(data) = self.data(&e) else {
            return format!("{name}: not split (its file unread)");
        };
        if rows < 2 || e.shape.is_empty() {
            return format!("{name}: not split (one position)");
        }
        let cut = self.rng.u32(1..rows);
        let row_len = data.len() / rows as usize;
        let (shift_a, shift_b) = match self.rng.u8(..4) {
            0 => (1, 0),
            1 => (0, 1),
            _ => (0, 0),
        };
        let mut parts = Vec::new();
        for (pos, rows) in [
            (
                e.key.pos.start..e.key.pos.start.wrapping_add(cut + shift_a),
                cut,
            ),
            (
                e.key.pos.start.wrapping_add(cut + shift_b)..e.key.pos.end.wrapping_add(shift_b),
                rows - cut,
            ),
        ] {
            let mut part = e.clone();
            part.key.pos = pos;
            part.shape[0] = rows as usize;
            let first = part.key.pos.start.wrapping_sub(e.key.pos.start) as usize;
            let bytes = data
                .get(first * row_len..(first + rows as usize) * row_len)
                .unwrap_or(&data[..])
                .to_vec();
            parts.push((part, bytes));
        }
        self.m.entries.remove(i);
        for (k, (part, bytes)) in parts.into_iter().enumerate() {
            self.m.entries.insert(i + k, part);
            self.write(i + k, &bytes);
        }
        format!("{name}: split at row {cut} (shifted {shift_a}, {shift_b})")
    }

    /// A tensor's shards (a ranked tap's, or an unranked tap's made
    /// ranked) cut again along axis 1 at random points: shards of zero
    /// width, a shard past the full extent, two ranks holding one shard,
    /// each written with its columns of the full tensor.
    pub(crate) fn reshard(&mut self) -> String {
        let i = self.pick();
        let name = self.name(i);
        let key = self.m.entries[i].key.clone().with_rank(None, None);
        let group: Vec<usize> = (0..self.m.entries.len())
            .filter(|&j| self.m.entries[j].key.clone().with_rank(None, None) == key)
            .filter(|&j| self.m.entries[j].key.shard.is_none_or(|s| s.axis == 1))
            .collect();
        // The full tensor, its columns put back in order.
        let mut parts: Vec<(u32, usize)> = group
            .iter()
            .map(|&j| (self.m.entries[j].key.shard.map_or(0, |s| s.start), j))
            .collect();
        parts.sort_unstable();
        let Some(first) = parts.first().map(|&(_, j)| self.m.entries[j].clone()) else {
            return format!("{name}: not resharded (sharded along another axis)");
        };
        let two_axes = |e: &Entry| e.shape.len() == 2 && e.shape[0] > 0 && e.dtype.size() > 0;
        if parts.iter().any(|&(_, j)| !two_axes(&self.m.entries[j])) {
            return format!("{name}: not resharded (not two axes)");
        }
        let (rows, size) = (first.shape[0], first.dtype.size());
        let mut columns: Vec<Vec<u8>> = vec![Vec::new(); rows];
        for &(_, j) in &parts {
            let e = self.m.entries[j].clone();
            let Some(data) = self.data(&e) else {
                return format!("{name}: not resharded (a file unread)");
            };
            let width = e.shape[1] * size;
            for (r, row) in data.chunks_exact(width.max(1)).take(rows).enumerate() {
                columns[r].extend_from_slice(row);
            }
        }
        let full = columns[0].len() / size;
        let mut cuts: Vec<usize> = (0..self.rng.usize(1..4))
            .map(|_| self.rng.usize(..=full))
            .collect();
        cuts.extend([0, full]);
        cuts.sort_unstable();
        // Shards of no width only sometimes: the open refuses them.
        if self.rng.u8(..4) != 0 {
            cuts.dedup();
        }
        let mut shards: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        let odd = match self.rng.u8(..6) {
            0 => {
                let s = shards[self.rng.usize(..shards.len())];
                shards.push(s);
                ", one held twice"
            }
            1 => {
                shards.push((full, full + 1));
                ", one past the full extent"
            }
            _ => "",
        };
        let mut at = parts.iter().map(|&(_, j)| j).min().unwrap_or(i);
        let mut drop: Vec<usize> = parts.iter().map(|&(_, j)| j).collect();
        drop.sort_unstable();
        for j in drop.into_iter().rev() {
            self.m.entries.remove(j);
        }
        for (rank, &(start, end)) in shards.iter().enumerate() {
            let mut e = first.clone();
            e.key.rank = Some(rank as u32);
            e.key.shard = Some(Shard {
                axis: 1,
                start: start as u32,
                end: end as u32,
                full: full as u32,
            });
            e.shape = vec![rows, end.saturating_sub(start)];
            let data: Vec<u8> = columns
                .iter()
                .flat_map(|c| c.get(start * size..end * size).unwrap_or(&[]).to_vec())
                .collect();
            at = at.min(self.m.entries.len());
            self.m.entries.insert(at, e);
            self.write(at, &data);
            at += 1;
        }
        let cuts: Vec<String> = shards.iter().map(|(a, b)| format!("{a}-{b}")).collect();
        format!("{name}: resharded {} of {full}{odd}", cuts.join(","))
    }

    /// An entry's tensor bytes, from its tap file.
    pub(crate) fn data(&self, e: &Entry) -> Option<Vec<u8>> {
        let f = std::fs::read(self.tree.join(&e.path)).ok()?;
        let h = capture::tapfile::parse(&f).ok()?;
        Some(f[h.data_start..].to_vec())
    }

    /// Writes entry `i`'s tap file with `data` as its tensor (at the path
    /// its key gives it), and its hashes, byte count and path to match.
    pub(crate) fn write(&mut self, i: usize, data: &[u8]) {
        let e = &self.m.entries[i];
        let header = capture::tapfile::encode_header(&e.key, e.dtype, &e.shape, data.len());
        let path = manifest::path_of(&e.key);
        let file = self.tree.join(&path);
        let _ = file.parent().map(std::fs::create_dir_all);
        if std::fs::write(&file, [header.as_slice(), data].concat()).is_err() {
            return;
        }
        let e = &mut self.m.entries[i];
        e.path = path;
        e.blake3 = blake3::hash(data).to_hex().to_string();
        e.header_blake3 = Some(blake3::hash(&header).to_hex().to_string());
        e.bytes = data.len() as u64;
    }
}
