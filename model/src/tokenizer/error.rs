/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is not a kind this crate builds.
    #[error("{path}: tokenizer model {model:?} is not supported (supported: gpt2 byte-level BPE, llama SentencePiece with a Gemma vocabulary)")]
    UnsupportedModel {
        /// The model file.
        path: String,
        /// The kind it names.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("{path}: pre-tokenizer {pre:?} is not supported (supported: smollm, starcoder, refact, gpt-2, default, llama-bpe, qwen2)")]
    UnsupportedPre {
        /// The model file.
        path: String,
        /// The pre-tokenizer it names.
        pre: String,
    },
    /// A tokenizer metadata value is absent or unusable.
    #[error("{path}: tokenizer metadata {key}: {reason}")]
    BadMetadata {
        /// The model file.
        path: String,
        /// The metadata key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The `tokenizers` crate could not build the tokenizer from the GGUF's
    /// vocabulary, or load `tokenizer.json`.
    #[error("{path}: {message}")]
    Build {
        /// The model file (or `tokenizer.json`).
        path: String,
        /// Its message.
        message: String,
    },
    /// The model's chat template is neither ChatML nor Gemma's turns.
    #[error("chat template is not ChatML nor Gemma's and is not supported: {excerpt:?}")]
    UnsupportedChatTemplate {
        /// The template's first 120 characters.
        excerpt: String,
    },
    /// The model carries no chat template, so a conversation cannot be rendered.
    #[error("the model carries no chat template")]
    NoChatTemplate,
    /// The `tokenizers` crate failed to encode.
    #[error("encoding {text:?}: {message}")]
    Encode {
        /// The text, as given.
        text: String,
        /// Its message.
        message: String,
    },
    /// The `tokenizers` crate failed to decode.
    #[error("decoding {ids:?}: {message}")]
    Decode {
        /// The ids, as given.
        ids: Vec<u32>,
        /// Its message.
        message: String,
    },
}
