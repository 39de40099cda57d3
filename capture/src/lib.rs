//! The taptree tap API and tree format.
//!
//! An instrumented forward calls [`tap`] at every op; while a [`Capture`] is
//! armed, selected taps are copied to writer threads that hash them (blake3)
//! and write one safetensors file each. [`Capture::finish`] writes the
//! [`Manifest`] last and atomically: its presence means the tree is complete.
//! [`TreeReader`] opens a tree, lists taps in forward order, maps a tap
//! zero-copy ([`TensorView`]) and rehashes everything ([`TreeReader::verify`]);
//! [`compare()`] tells whether two trees are bitwise identical from their
//! manifests alone. Disarmed, [`tap`] is one relaxed atomic load and a branch;
//! the `compile-out` feature removes even that.
//!
//! ```
//! use capture::{Capture, CaptureOptions, RunInfo, Selection, StageSpec, TreeReader};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let out = dir.path().join("run");
//! let cap = Capture::start(CaptureOptions {
//!     out: out.clone(),
//!     selection: Selection::parse("stage=ffn_*").unwrap(),
//!     force: false,
//!     stages: vec![StageSpec::layer("ffn_up", &[]), StageSpec::layer("attn", &[])],
//!     run: RunInfo::default(),
//! })
//! .unwrap();
//! // Two positions (rows) of a 3-wide activation, then a tap the selection drops.
//! capture::tap("ffn_up", Some(0), 0..2, None, &[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! capture::tap("attn", Some(0), 0..2, None, &[2, 1], &[0.5f32, 0.25]);
//! let summary = cap.finish().unwrap();
//! assert_eq!(summary.taps, 1);
//!
//! let tree = TreeReader::open(&out).unwrap();
//! let entry = &tree.entries()[0];
//! assert_eq!(entry.key.to_string(), "L0/ffn_up@0..2");
//! let view = tree.read(entry).unwrap();
//! assert_eq!(view.shape(), &[2, 3]);
//! assert_eq!(view.as_slice::<f32>().unwrap()[4], 5.0);
//! tree.verify().unwrap();
//! ```

#![deny(missing_docs)]
mod arm;
pub mod compare;
mod dir_text;
pub mod dtype;
pub mod entries;
mod error;
pub mod hashes;
pub mod index;
pub mod key;
mod key_hash;
pub mod manifest;
mod manifest_file;
mod open;
mod out_dir;
mod reader;
pub mod select;
mod session;
mod spare;
pub mod stage;
pub mod tapfile;
mod tensor_view;
mod tree_dir;
mod unsealed;
mod writer;

pub use arm::{is_armed, selected_runs, tap, tap_owned, tap_ranked, wants};
pub use compare::{compare, Comparison, Difference};
pub use dtype::{DType, TapElem};
pub use entries::{Dims, Entries};
pub use error::{Error, Result};
/// The `half` crate whose `f16` and `bf16` implement [`TapElem`].
pub use half;
pub use key::{Key, ParseKeyError, RowId, Shard, Site, TapId};
pub use manifest::{Entry, Manifest, RunInfo, FORMAT_VERSION};
pub use manifest_file::ManifestHead;
pub use reader::{TreeReader, Verified};
pub use select::Selection;
pub use session::{force_is_set, Capture, CaptureOptions, Summary};
pub use stage::{Scope, StageSpec};
pub use tensor_view::TensorView;
pub use unsealed::Unsealed;
