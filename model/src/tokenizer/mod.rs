//! The model's tokenizer, built from GGUF metadata (or an HF `tokenizer.json`),
//! and its chat template.
//!
//! GGUF's `gpt2` tokenizer is byte-level BPE: the vocabulary and merges come
//! from `tokenizer.ggml.tokens` / `tokenizer.ggml.merges`, control and
//! user-defined tokens (`tokenizer.ggml.token_type` 3 and 4, e.g.
//! `<|im_start|>`) become special added tokens matched verbatim in the input,
//! and `tokenizer.ggml.pre` picks the pre-tokenizer regexes llama.cpp would
//! use. GGUF's `llama` tokenizer with Gemma's vocabulary is SentencePiece
//! BPE ([`crate::tokenizer::Tokenizer::from_gguf`] builds it as Hugging
//! Face's `GemmaTokenizer` does from a GGUF: merges rebuilt from the
//! vocabulary in file order, byte fallback, spaces as `▁`). The chat template
//! is not run as Jinja: ChatML and Gemma turn templates are recognised and
//! rendered directly (a Gemma vocabulary without a template gets Gemma's
//! turns); any other template is refused by name.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::gguf::{GgufFile, Value};

mod chat;
mod error;
mod sentencepiece;

pub use chat::{ChatTemplate, TurnFormat};
pub use error::TokenizerError;
use sentencepiece::{
    has_gemma_turns, sentencepiece_gemma, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED,
};

/// A tokenizer with its special ids and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: HfTokenizer,
    /// The beginning-of-sequence token, if the model declares one.
    pub bos_id: Option<u32>,
    /// The end-of-sequence token (generation stops there), if the model declares one.
    pub eos_id: Option<u32>,
    /// Whether [`Tokenizer::encode`] prepends `bos_id`.
    pub add_bos: bool,
    /// The template's source text, when the model carries one.
    pub chat_template_source: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// Llama 3's split regex (llama.cpp's `llama-bpe`): digits in groups of up
/// to three.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: the same with single digits.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex split followed by byte-level mapping without GPT-2's regex, as
/// these models' `tokenizer.json` files have it.
fn split_then_bytes(regex: &str) -> PreTokenizerWrapper {
    let split = Split::new(
        SplitPattern::Regex(regex.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .expect("the regex is valid");
    Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into()
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
fn pre_tokenizer(pre: &str) -> Option<PreTokenizerWrapper> {
    let byte_level = ByteLevel::new(false, true, true);
    Some(match pre {
        "llama-bpe" | "llama3" => split_then_bytes(LLAMA3_REGEX),
        "qwen2" => split_then_bytes(QWEN2_REGEX),
        // llama.cpp splits every digit off first (`\p{N}`), then applies the
        // GPT-2 regex.
        "smollm" | "starcoder" | "refact" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
        "gpt-2" | "gpt2" | "default" => byte_level.into(),
        _ => return None,
    })
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes; `Ok(None)` when it carries
    /// no tokenizer at all.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Option<Tokenizer>, TokenizerError> {
        let path = gguf.path().display().to_string();
        let Some(model) = gguf.get("tokenizer.ggml.model") else {
            return Ok(None);
        };
        let model = model.as_str().unwrap_or("");
        if model == "llama" && has_gemma_turns(gguf) {
            let (inner, n_tokens) = sentencepiece_gemma(gguf)?;
            return Ok(Some(Tokenizer::with_gguf_specials(inner, gguf, n_tokens)));
        }
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                path,
                model: model.into(),
            });
        }
        let bad = |key: &'static str, reason: &str| TokenizerError::BadMetadata {
            path: path.clone(),
            key,
            reason: reason.into(),
        };
        let strings = |key: &'static str| -> Result<Vec<String>, TokenizerError> {
            let arr = gguf
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(key, "missing or not an array"))?;
            arr.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad(key, "not an array of strings"))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        bad(
                            "tokenizer.ggml.merges",
                            &format!("merge {m:?} has no space"),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        let types: Vec<i64> = match gguf.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .filter(|t| t.len() == tokens.len())
                .ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.token_type",
                        "not an integer array as long as the token list",
                    )
                })?,
        };
        let pre = gguf
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let pre_tok = pre_tokenizer(pre).ok_or_else(|| TokenizerError::UnsupportedPre {
            path: path.clone(),
            pre: pre.into(),
        })?;
        let special: Vec<&str> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(s, _)| s.as_str())
            .collect();
        let inner = build(&path, &tokens, merges, &special, pre_tok)?;
        Ok(Some(Tokenizer::with_gguf_specials(
            inner,
            gguf,
            tokens.len(),
        )))
    }

    /// `inner` with the BOS/EOS ids (those inside a vocabulary of `n_tokens`),
    /// the add-BOS flag and the chat template the GGUF's metadata names.
    fn with_gguf_specials(inner: HfTokenizer, gguf: &GgufFile, n_tokens: usize) -> Tokenizer {
        let id_of = |key: &str| {
            gguf.get(key)
                .and_then(Value::as_u64)
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < n_tokens)
        };
        Tokenizer {
            inner,
            bos_id: id_of("tokenizer.ggml.bos_token_id"),
            eos_id: id_of("tokenizer.ggml.eos_token_id"),
            add_bos: gguf
                .get("tokenizer.ggml.add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            chat_template_source: gguf
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }

    /// Loads an HF `tokenizer.json`; `bos`/`eos` and the template come from
    /// the checkpoint's `tokenizer_config.json` when the caller has it.
    pub fn from_hf_file(
        path: &Path,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        add_bos: bool,
        chat_template: Option<String>,
    ) -> Result<Tokenizer, TokenizerError> {
        let inner = HfTokenizer::from_file(path).map_err(|e| TokenizerError::Build {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Tokenizer {
            inner,
            bos_id,
            eos_id,
            add_bos,
            chat_template_source: chat_template,
        })
    }

    /// The underlying `tokenizers` tokenizer (e.g. to save as `tokenizer.json`).
    pub fn inner(&self) -> &HfTokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token written exactly as in the vocabulary, if it is in it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// A token id's text as the vocabulary spells it (byte-level or `▁` marks
    /// included); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`)
    /// are recognised; BOS is prepended when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode {
                text: text.into(),
                message: e.to_string(),
            })?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens included verbatim.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode {
                ids: ids.to_vec(),
                message: e.to_string(),
            })
    }

    /// The parsed chat template; Gemma's turns for a Gemma vocabulary that
    /// carries no template (the Gemma 3 GGUFs of llama.cpp's converter).
    pub fn chat_template(&self) -> Result<ChatTemplate, TokenizerError> {
        match self.chat_template_source.as_deref() {
            Some(t) => ChatTemplate::parse(t),
            None if self.has_gemma_turns() => Ok(ChatTemplate::gemma()),
            None => Err(TokenizerError::NoChatTemplate),
        }
    }

    fn has_gemma_turns(&self) -> bool {
        self.token_to_id("<start_of_turn>").is_some() && self.token_to_id("<end_of_turn>").is_some()
    }

    /// The prompt text of one user turn, ready for generation.
    pub fn render_chat(&self, user: &str) -> Result<String, TokenizerError> {
        Ok(self.chat_template()?.render_user(user))
    }

    /// Token ids of one user turn, ready for generation.
    pub fn encode_chat(&self, user: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode(&self.render_chat(user)?)
    }

    /// Whether `id` ends generation (EOS, or `<|im_end|>` in a chat).
    pub fn is_end(&self, id: u32) -> bool {
        self.end_ids().contains(&id)
    }

    /// The ids that end an answer: end of sequence, ChatML's `<|im_end|>`
    /// and Gemma's `<end_of_turn>`.
    pub fn end_ids(&self) -> Vec<u32> {
        [
            self.eos_id,
            self.token_to_id("<|im_end|>"),
            self.token_to_id("<end_of_turn>"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// A byte-level BPE tokenizer over `tokens` (ids are list positions).
fn build(
    path: &str,
    tokens: &[String],
    merges: Vec<(String, String)>,
    special: &[&str],
    pre: PreTokenizerWrapper,
) -> Result<HfTokenizer, TokenizerError> {
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TokenizerError::Build {
            path: path.into(),
            message: e.to_string(),
        })?;
    let mut inner = HfTokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let added: Vec<AddedToken> = special
        .iter()
        .map(|s| AddedToken::from(s.to_string(), true))
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(pre: &str) -> HfTokenizer {
        let tokens: Vec<String> = ["<s>", "1", "2", "12", "Ġ", "a"].map(String::from).to_vec();
        let merges = vec![("1".to_string(), "2".to_string())];
        build("t", &tokens, merges, &["<s>"], pre_tokenizer(pre).unwrap()).unwrap()
    }

    fn ids(t: &HfTokenizer, s: &str) -> Vec<u32> {
        t.encode(s, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn llama3_groups_digits_by_three_and_qwen2_splits_them() {
        let tokens: Vec<String> = ["1", "2", "3", "12", "123", "Ġ", "a", "Ġa"]
            .map(String::from)
            .to_vec();
        let merges = vec![
            ("1".to_string(), "2".to_string()),
            ("12".to_string(), "3".to_string()),
            ("Ġ".to_string(), "a".to_string()),
        ];
        let build_with = |pre: &str| {
            build(
                "t",
                &tokens,
                merges.clone(),
                &[],
                pre_tokenizer(pre).unwrap(),
            )
            .unwrap()
        };
        assert_eq!(ids(&build_with("llama-bpe"), "1231 a"), [4, 0, 7]);
        assert_eq!(ids(&build_with("qwen2"), "1231 a"), [0, 1, 2, 0, 7]);
    }

    #[test]
    fn smollm_splits_digits_before_merging_and_gpt2_does_not() {
        assert_eq!(ids(&tiny("smollm"), "12"), [1, 2]);
        assert_eq!(ids(&tiny("gpt-2"), "12"), [3]);
        assert_eq!(ids(&tiny("smollm"), "a<s>12"), [5, 0, 1, 2]);
        assert!(pre_tokenizer("deepseek-coder").is_none());
    }
}
