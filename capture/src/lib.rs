//! The taptree tap API and tree format (being written).

pub mod dtype;
pub mod key;
pub mod stage;

pub use dtype::{DType, TapElem};
pub use key::Key;
pub use stage::{Scope, StageSpec};
