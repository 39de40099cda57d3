//! Renderers of a [`crate::Report`] (and of a [`crate::stat::StatReport`]):
//! siblings that only format what the report holds.

pub mod html;
pub mod json;
pub mod table;
