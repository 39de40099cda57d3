//! Compare two taptree trees (being written).
