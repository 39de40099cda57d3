//! The root integration tests, end to end through the `taptree` binary: one
//! test binary, one module per idea. Shared: [`harness`] (running the
//! binary, the lock around in-process captures) and the synthetic trees of
//! the diff and verify tests.
//!
//! Run one module with `cargo test --release --test tests MODULE::`.

mod diff_support;
mod harness;
mod verify_support;

// `taptree bisect commits` (and the helper capture both bisect tests use).
mod bisect_cli;
// `taptree bisect switches`.
mod bisect_switches_cli;
// `taptree capture` on the fixture models and SmolLM2.
mod capture_cli;
// `taptree capture --select`.
mod capture_select_cli;
// `taptree diff` on synthetic trees: verdicts, exit codes, bad input.
mod diff_cli;
// The diff's metrics against the numpy peer.
mod diff_numpy_cli;
// `taptree drift`.
mod drift_cli;
// The `taptree` front against the full command it hands over to.
mod front_cli;
// `taptree capture --engine`: flags, and the Hugging Face forward.
mod engine_cli;
// Trees of different engines compared without false alarms.
mod engines_cli;
// `taptree replay`.
mod replay_cli;
// `taptree replay` of llama.cpp trees.
mod replay_llamacpp_cli;
// The HTML report clicked in headless Chromium.
mod report_browser;
// `taptree capture --tp` and the diff of tensor-parallel trees.
mod tp_cli;
// `taptree ls` and `taptree verify`.
mod verify_cli;
// `taptree verify` on damaged and hostile trees.
mod verify_damage_cli;
