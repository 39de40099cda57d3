//! The taps of a tensor-parallel run: replicated stages from rank 0
//! without a rank, a rank's stages with its rank and shard; each copied to
//! the host at once, only when armed and selected.

use std::ops::Range;

use cudarc::driver::CudaSlice;

use crate::cuda::device::Device;
use crate::cuda::ops;
use crate::cuda::CudaError;
use capture::{Shard, TapId};

/// Where a run's taps are: its positions and slot.
pub(super) struct At {
    pub pos: Range<u32>,
    pub slot: Option<u32>,
    pub rows: usize,
}

impl At {
    fn wants(&self, stage: &str, layer: Option<u32>) -> bool {
        capture::wants(stage, layer, self.pos.clone(), self.slot)
    }

    /// Taps a replicated stage: `buf` (`[rows, width]`) of rank 0.
    pub fn full(
        &self,
        dev: &Device,
        stage: &str,
        layer: Option<u32>,
        buf: &CudaSlice<f32>,
        width: usize,
    ) -> Result<(), CudaError> {
        if !self.wants(stage, layer) {
            return Ok(());
        }
        let host = ops::download(dev, &buf.slice(..self.rows * width))?;
        capture::tap(
            stage,
            layer,
            self.pos.clone(),
            self.slot,
            &[self.rows, width],
            &host,
        );
        Ok(())
    }

    /// Taps columns `cols` of rank `rank`'s `buf` (`[rows, width]`), placed
    /// at `place` of a full tensor `full` wide (none: a partial sum).
    #[allow(clippy::too_many_arguments)]
    pub fn ranked(
        &self,
        dev: &Device,
        stage: &str,
        layer: usize,
        rank: usize,
        buf: &CudaSlice<f32>,
        width: usize,
        cols: Range<usize>,
        place: Option<(Range<usize>, usize)>,
    ) -> Result<(), CudaError> {
        let li = Some(layer as u32);
        if cols.is_empty() || !self.wants(stage, li) {
            return Ok(());
        }
        let host = ops::download(dev, &buf.slice(..self.rows * width))?;
        let data: Vec<f32> = if cols.len() == width {
            host
        } else {
            host.chunks_exact(width)
                .flat_map(|r| r[cols.clone()].iter().copied())
                .collect()
        };
        let shard = place.map(|(c, full)| Shard {
            axis: 1,
            start: c.start as u32,
            end: c.end as u32,
            full: full as u32,
        });
        let id = TapId::new(stage, li, self.pos.clone(), self.slot);
        capture::tap_ranked(id, rank as u32, shard, &[self.rows, cols.len()], &data);
        Ok(())
    }
}
