//! The one error type of the crate: every variant names the file or value
//! first, so a message reads `runs/a/L003/x.safetensors: truncated: ...`.

use std::path::PathBuf;

/// Everything that can go wrong while capturing or reading a tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on `path` failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// `path` holds files but is not a taptree tree; nothing there is touched.
    #[error("{}: not empty and not a taptree tree; refusing to capture into it (nothing was changed)", path.display())]
    NotATree { path: PathBuf },

    /// `path` already holds a tree and the capture was not forced.
    #[error("{}: already holds a tree; pass --force (or TAPTREE_FORCE=1) to replace it", path.display())]
    TreeExists { path: PathBuf },

    /// A selection that selects no tap: a stage glob that matches no stage
    /// of the vocabulary, or a capture that ended with no tap selected.
    #[error("{}: --select {selection:?} {reason}", path.display())]
    SelectsNothing {
        path: PathBuf,
        selection: String,
        reason: String,
    },

    /// Another capture is writing to `path` right now.
    #[error("{}: another capture to this path is running ({holder}); nothing was changed", path.display())]
    Locked { path: PathBuf, holder: String },

    /// `path` is a directory with no file at all: nothing was captured there.
    #[error("{}: not a tree (empty directory)", path.display())]
    EmptyDir { path: PathBuf },

    /// `path` has no manifest: the capture crashed or is still running.
    #[error("{}: incomplete capture: no manifest.json (the capture crashed or is still running)", path.display())]
    Incomplete { path: PathBuf },

    /// The manifest's major version is not one this reader understands.
    #[error("{}: unsupported tree format version {found} (this taptree reads {oldest}.x to {supported}.x)", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: String,
        /// The oldest and newest major versions read.
        oldest: u32,
        supported: u32,
    },

    /// The manifest is not valid JSON or not a taptree manifest.
    #[error("{}: bad manifest: {reason}", path.display())]
    BadManifest { path: PathBuf, reason: String },

    /// A manifest entry's path is absolute, escapes the tree, or is a link
    /// pointing outside it.
    #[error("{}: unsafe path {entry:?} in manifest: {reason}", tree.display())]
    UnsafePath {
        tree: PathBuf,
        entry: String,
        reason: String,
    },

    /// A manifest entry's dtype, shape and byte count disagree, or its shape's
    /// element count overflows.
    #[error("{}: bad shape {shape:?} for {key}: {reason}", path.display())]
    BadShape {
        path: PathBuf,
        key: String,
        shape: Vec<usize>,
        reason: String,
    },

    /// A tap file is truncated, not safetensors, or disagrees with the manifest.
    #[error("{}: {reason}", path.display())]
    CorruptTap { path: PathBuf, reason: String },

    /// A tap file's tensor bytes do not hash to what the manifest recorded.
    #[error("{}: integrity failure: tensor blake3 is {actual}, manifest says {expected}", path.display())]
    HashMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    /// A selection string could not be parsed; `part` is the offending piece.
    #[error("selection {input:?}: {part:?}: {reason}")]
    Selection {
        input: String,
        part: String,
        reason: String,
    },

    /// A second capture was started while one is armed in this process.
    #[error("{}: another capture is already armed in this process (into {})", path.display(), other.display())]
    AlreadyArmed { path: PathBuf, other: PathBuf },

    /// A tap call broke the API contract (shape, stage name, duplicate key).
    #[error("{}: bad tap {key}: {reason}", path.display())]
    BadTap {
        path: PathBuf,
        key: String,
        reason: String,
    },

    /// A writer thread died without reporting.
    #[error("{}: a writer thread panicked", path.display())]
    WriterPanicked { path: PathBuf },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
