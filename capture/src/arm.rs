//! The hot path: `is_armed`, `wants`, `tap`.
//!
//! Disarmed, a tap is one relaxed atomic load and a branch. Armed, the
//! selection is checked before anything is copied; a selected tap copies its
//! rows once into a buffer that a writer thread hashes and writes.

#![cfg_attr(feature = "compile-out", allow(dead_code, unused_imports))]

use crate::dtype::{DType, TapElem};
use crate::key::{Shard, TapId};
use crate::writer::{Active, TapBytes};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Set while a capture is armed. Relaxed is enough: a tap racing with
/// arming may be missed or taken, and `ACTIVE` is the synchronised truth.
static ARMED: AtomicBool = AtomicBool::new(false);
static ACTIVE: RwLock<Option<Arc<Active>>> = RwLock::new(None);

/// Whether a capture is armed in this process.
#[cfg(not(feature = "compile-out"))]
#[inline(always)]
pub fn is_armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Whether a tap with this identity would be kept: armed, and selected.
/// GPU code calls it before copying a device buffer to the host.
#[cfg(not(feature = "compile-out"))]
#[inline(always)]
pub fn wants(stage: &str, layer: Option<u32>, pos: Range<u32>, slot: Option<u32>) -> bool {
    is_armed() && wants_armed(TapId::new(stage, layer, pos, slot))
}

/// The runs of positions within `pos` whose rows of this tap would be kept
/// (armed, the identity selected), in order; none when disarmed. A forward
/// may compute only these rows of an op nothing else reads (the logits
/// beyond the last position, say).
#[cfg(not(feature = "compile-out"))]
pub fn selected_runs(
    stage: &str,
    layer: Option<u32>,
    pos: Range<u32>,
    slot: Option<u32>,
) -> Vec<Range<u32>> {
    if !is_armed() {
        return Vec::new();
    }
    let guard = ACTIVE.read().unwrap_or_else(|p| p.into_inner());
    match guard.as_ref() {
        Some(active)
            if active
                .selection
                .matches_identity(TapId::new(stage, layer, pos.clone(), slot)) =>
        {
            active.selection.selected_runs(pos).collect()
        }
        _ => Vec::new(),
    }
}

/// Records a tensor. `shape[0]` must equal `pos.len()` (rows are positions)
/// and `data` must hold exactly the shape's element count. Call in forward
/// order. A broken contract does not panic here: it fails the capture's
/// `finish()` with a message naming the tap.
#[cfg(not(feature = "compile-out"))]
#[inline(always)]
pub fn tap<T: TapElem>(
    stage: &str,
    layer: Option<u32>,
    pos: Range<u32>,
    slot: Option<u32>,
    shape: &[usize],
    data: &[T],
) {
    if is_armed() {
        let id = TapId::new(stage, layer, pos, slot);
        tap_armed(id, shape, bytemuck::cast_slice(data), T::DTYPE);
    }
}

/// [`tap`] of a buffer the caller is done with: when the selection keeps
/// all of its rows, the writers take the buffer itself rather than a copy
/// (a prefill's logits, megabytes, copied on the forward's clock). The
/// tree is the same as [`tap`]'s of the same data, bit for bit; disarmed or
/// not selected, the buffer is dropped.
#[cfg(not(feature = "compile-out"))]
#[inline(always)]
pub fn tap_owned<T: TapElem + Send>(
    stage: &str,
    layer: Option<u32>,
    pos: Range<u32>,
    slot: Option<u32>,
    shape: &[usize],
    data: Vec<T>,
) {
    if is_armed() {
        let id = TapId::new(stage, layer, pos, slot);
        tap_owned_armed(id, shape, Box::new(data), T::DTYPE);
    }
}

/// [`tap`] of one tensor-parallel rank's tensor: `shard` places it in the
/// full tensor (none: a per-rank tensor of the full shape, such as an
/// addend before an all-reduce). Same contract as [`tap`]; a shard whose
/// axis is 0 or beyond the shape, whose range is empty or leaves `full`, or
/// whose extent differs from `shape[axis]`, fails the capture's `finish()`.
#[cfg(not(feature = "compile-out"))]
#[inline(always)]
pub fn tap_ranked<T: TapElem>(
    id: TapId<'_>,
    rank: u32,
    shard: Option<Shard>,
    shape: &[usize],
    data: &[T],
) {
    if is_armed() {
        let id = id.with_rank(Some(rank), shard);
        tap_armed(id, shape, bytemuck::cast_slice(data), T::DTYPE);
    }
}

#[cold]
#[inline(never)]
fn wants_armed(id: TapId<'_>) -> bool {
    // Under the read guard, not through a cloned Arc: an unselected tap
    // then costs one uncontended lock and the selection check, nothing more.
    let guard = ACTIVE.read().unwrap_or_else(|p| p.into_inner());
    match guard.as_ref() {
        Some(active) => active.selection.wants(id),
        None => false,
    }
}

#[cold]
#[inline(never)]
fn tap_armed(id: TapId<'_>, shape: &[usize], bytes: &[u8], dtype: DType) {
    // Holding the read guard while the tap is queued makes `disarm` wait for
    // taps in flight, so none lands after `finish` collected the writers.
    let guard = ACTIVE.read().unwrap_or_else(|p| p.into_inner());
    if let Some(active) = guard.as_ref() {
        active.tap(id, shape, bytes, dtype);
    }
}

#[cold]
#[inline(never)]
fn tap_owned_armed(id: TapId<'_>, shape: &[usize], data: Box<dyn TapBytes>, dtype: DType) {
    // As in `tap_armed`: queued under the read guard.
    let guard = ACTIVE.read().unwrap_or_else(|p| p.into_inner());
    if let Some(active) = guard.as_ref() {
        active.tap_owned(id, shape, data, dtype);
    }
}

fn current() -> Option<Arc<Active>> {
    ACTIVE.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Installs `active` as the one armed capture; hands it back if another is armed.
pub(crate) fn arm(active: Arc<Active>) -> Result<(), Arc<Active>> {
    let mut slot = ACTIVE.write().unwrap_or_else(|p| p.into_inner());
    if slot.is_some() {
        return Err(active);
    }
    *slot = Some(active);
    ARMED.store(true, Ordering::Relaxed);
    Ok(())
}

/// The capture armed now, if any.
pub(crate) fn armed_capture() -> Option<Arc<Active>> {
    current()
}

/// Disarms `active` if it is the armed capture.
pub(crate) fn disarm(active: &Arc<Active>) {
    let mut slot = ACTIVE.write().unwrap_or_else(|p| p.into_inner());
    if slot.as_ref().is_some_and(|a| Arc::ptr_eq(a, active)) {
        ARMED.store(false, Ordering::Relaxed);
        *slot = None;
    }
}

// With `compile-out`, taps vanish at compile time: the baseline against which
// "disarmed" is measured. Captures still start and finish, with no taps.

/// Always false: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
#[inline(always)]
pub fn is_armed() -> bool {
    false
}

/// Always false: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
#[inline(always)]
pub fn wants(_stage: &str, _layer: Option<u32>, _pos: Range<u32>, _slot: Option<u32>) -> bool {
    false
}

/// None: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
pub fn selected_runs(
    _stage: &str,
    _layer: Option<u32>,
    _pos: Range<u32>,
    _slot: Option<u32>,
) -> Vec<Range<u32>> {
    Vec::new()
}

/// Does nothing: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
#[inline(always)]
pub fn tap_ranked<T: TapElem>(
    _id: TapId<'_>,
    _rank: u32,
    _shard: Option<Shard>,
    _shape: &[usize],
    _data: &[T],
) {
}

/// Drops `data`: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
#[inline(always)]
pub fn tap_owned<T: TapElem + Send>(
    _stage: &str,
    _layer: Option<u32>,
    _pos: Range<u32>,
    _slot: Option<u32>,
    _shape: &[usize],
    _data: Vec<T>,
) {
}

/// Does nothing: taps are compiled out (feature `compile-out`).
#[cfg(feature = "compile-out")]
#[inline(always)]
pub fn tap<T: TapElem>(
    _stage: &str,
    _layer: Option<u32>,
    _pos: Range<u32>,
    _slot: Option<u32>,
    _shape: &[usize],
    _data: &[T],
) {
}
