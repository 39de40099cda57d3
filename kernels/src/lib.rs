//! Model loading and instrumented forwards (being written).
