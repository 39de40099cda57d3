/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: tokenizer model {model:?} is not supported (supported: gpt2 byte-level BPE, llama SentencePiece with a Gemma vocabulary)")]
    UnsupportedModel { path: String, model: String },
    #[error("{path}: pre-tokenizer {pre:?} is not supported (supported: smollm, starcoder, refact, gpt-2, default, llama-bpe, qwen2)")]
    UnsupportedPre { path: String, pre: String },
    #[error("{path}: tokenizer metadata {key}: {reason}")]
    BadMetadata {
        path: String,
        key: &'static str,
        reason: String,
    },
    #[error("{path}: {message}")]
    Build { path: String, message: String },
    #[error("chat template is not ChatML nor Gemma's and is not supported: {excerpt:?}")]
    UnsupportedChatTemplate { excerpt: String },
    #[error("the model carries no chat template")]
    NoChatTemplate,
    #[error("encoding {text:?}: {message}")]
    Encode { text: String, message: String },
    #[error("decoding {ids:?}: {message}")]
    Decode { ids: Vec<u32>, message: String },
}
