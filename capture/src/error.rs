//! The one error type of the crate: every variant names the file or value
//! first, so a message reads `runs/a/L003/x.safetensors: truncated: ...`.

use std::path::PathBuf;

/// Everything that can go wrong while capturing or reading a tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on `path` failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// `path` holds files but is not a taptree tree; nothing there is touched.
    #[error("{}: not empty and not a taptree tree; refusing to capture into it (nothing was changed)", path.display())]
    NotATree {
        /// The directory that was to hold the tree.
        path: PathBuf,
    },

    /// `path` already holds a tree and the capture was not forced.
    #[error("{}: already holds a tree; pass --force (or TAPTREE_FORCE=1) to replace it", path.display())]
    TreeExists {
        /// The tree's directory.
        path: PathBuf,
    },

    /// A selection that selects no tap: a stage glob that matches no stage
    /// of the vocabulary, or a capture that ended with no tap selected.
    #[error("{}: --select {selection:?} {reason}", path.display())]
    SelectsNothing {
        /// The tree's directory.
        path: PathBuf,
        /// The selection as given.
        selection: String,
        /// Why it selects nothing: the glob that matched no stage, or that no
        /// tap was selected.
        reason: String,
    },

    /// Another capture is writing to `path` right now.
    #[error("{}: another capture to this path is running ({holder}); nothing was changed", path.display())]
    Locked {
        /// The tree's directory.
        path: PathBuf,
        /// What the lock file says (`held by process N`), or that the lock is held.
        holder: String,
    },

    /// `path` is a directory with no file at all: nothing was captured there.
    #[error("{}: not a tree (empty directory)", path.display())]
    EmptyDir {
        /// The directory.
        path: PathBuf,
    },

    /// `path` has no manifest: the capture crashed or is still running.
    #[error("{}: incomplete capture: no manifest.json (the capture crashed or is still running)", path.display())]
    Incomplete {
        /// The tree's directory.
        path: PathBuf,
    },

    /// The manifest's major version is not one this reader understands.
    #[error("{}: unsupported tree format version {found} (this taptree reads {oldest}.x to {supported}.x)", path.display())]
    UnsupportedVersion {
        /// The manifest (or index) file.
        path: PathBuf,
        /// The version it declares.
        found: String,
        /// The oldest and newest major versions read.
        oldest: u32,
        /// The newest major version read.
        supported: u32,
    },

    /// The manifest's version is of the newest major version this reader
    /// knows, but a newer minor: its index or fields may follow rules this
    /// reader does not check, so it is refused rather than called damaged.
    #[error("{}: written by a newer taptree (format {found}); this taptree reads up to {newest}", path.display())]
    NewerVersion {
        /// The manifest file.
        path: PathBuf,
        /// The version it declares.
        found: String,
        /// The newest version this reader reads.
        newest: &'static str,
    },

    /// The manifest is not valid JSON or not a taptree manifest.
    #[error("{}: bad manifest: {reason}", path.display())]
    BadManifest {
        /// The manifest (or index) file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A manifest entry's path is absolute, escapes the tree, or is a link
    /// pointing outside it.
    #[error("{}: unsafe path {entry:?} in manifest: {reason}", tree.display())]
    UnsafePath {
        /// The tree's directory.
        tree: PathBuf,
        /// The entry's path, as the manifest writes it.
        entry: String,
        /// Why it is refused.
        reason: String,
    },

    /// A manifest entry's dtype, shape and byte count disagree, or its shape's
    /// element count overflows.
    #[error("{}: bad shape {shape:?} for {key}: {reason}", path.display())]
    BadShape {
        /// The manifest.
        path: PathBuf,
        /// The tap's key.
        key: String,
        /// The shape recorded.
        shape: Vec<usize>,
        /// What disagrees.
        reason: String,
    },

    /// A tap file is truncated, not safetensors, or disagrees with the manifest.
    #[error("{}: {reason}", path.display())]
    CorruptTap {
        /// The tap file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A tap file's tensor bytes do not hash to what the manifest recorded.
    #[error("{}: integrity failure: tensor blake3 is {actual}, manifest says {expected}", path.display())]
    HashMismatch {
        /// The tap file.
        path: PathBuf,
        /// The blake3 the manifest records, hex.
        expected: String,
        /// The blake3 of the bytes read, hex.
        actual: String,
    },

    /// A selection string could not be parsed; `part` is the offending piece.
    #[error("selection {input:?}: {part:?}: {reason}")]
    Selection {
        /// The selection string as given.
        input: String,
        /// The piece of it that failed.
        part: String,
        /// Why it failed.
        reason: String,
    },

    /// A second capture was started while one is armed in this process.
    #[error("{}: another capture is already armed in this process (into {})", path.display(), other.display())]
    AlreadyArmed {
        /// The tree the new capture was to write.
        path: PathBuf,
        /// The tree the armed capture is writing.
        other: PathBuf,
    },

    /// A tap call broke the API contract (shape, stage name, duplicate key).
    #[error("{}: bad tap {key}: {reason}", path.display())]
    BadTap {
        /// The tree being written.
        path: PathBuf,
        /// The tap's key.
        key: String,
        /// The contract it broke.
        reason: String,
    },

    /// A writer thread died without reporting.
    #[error("{}: a writer thread panicked", path.display())]
    WriterPanicked {
        /// The tree being written.
        path: PathBuf,
    },
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
