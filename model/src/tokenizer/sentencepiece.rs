//! Gemma's SentencePiece BPE, rebuilt from a GGUF vocabulary.

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::error::TokenizerError;
use crate::gguf::{GgufFile, Value};

/// GGUF token types that are matched verbatim rather than through BPE.
pub(super) const TOKEN_TYPE_CONTROL: i64 = 3;
/// See [`TOKEN_TYPE_CONTROL`].
pub(super) const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Whether a GGUF's vocabulary has Gemma's turn tokens.
pub(super) fn has_gemma_turns(gguf: &GgufFile) -> bool {
    let Some(tokens) = gguf.get("tokenizer.ggml.tokens").and_then(Value::as_array) else {
        return false;
    };
    let has = |s: &str| tokens.iter().any(|t| t.as_str() == Some(s));
    has("<start_of_turn>") && has("<end_of_turn>")
}

/// Gemma's SentencePiece BPE from a GGUF, built as Hugging Face's
/// `gemma_tokenizer` builds it from the same file (so the ids agree):
/// all-space tokens respelled as `▁` runs, merges rebuilt from the
/// vocabulary ranked by file order (the file's scores do not follow Gemma's
/// merge order), byte fallback, spaces normalized to `▁`, control tokens as
/// special added tokens and user-defined ones (`\n\n`, `<table>`) as added
/// tokens. Returns the tokenizer and the vocabulary size, for the caller
/// to add the file's special ids.
pub(super) fn sentencepiece_gemma(gguf: &GgufFile) -> Result<(HfTokenizer, usize), TokenizerError> {
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::normalizers::replace::Replace;

    let path = gguf.path().display().to_string();
    let bad = |key: &'static str, reason: &str| TokenizerError::BadMetadata {
        path: path.clone(),
        key,
        reason: reason.into(),
    };
    let tokens: Vec<String> = gguf
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect())
        .ok_or_else(|| bad("tokenizer.ggml.tokens", "not an array of strings"))?;
    let types: Vec<i64> = gguf
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
        .filter(|t| t.len() == tokens.len())
        .ok_or_else(|| {
            bad(
                "tokenizer.ggml.token_type",
                "not an integer array as long as the token list",
            )
        })?;
    let tokens: Vec<String> = tokens
        .into_iter()
        .map(|t| {
            if t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t
            }
        })
        .collect();
    let vocab: std::collections::HashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges_from_vocabulary(&tokens, &vocab);
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(t, &i)| (t.clone(), i))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .unk_token("<unk>".into())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(|e| TokenizerError::Build {
            path: path.clone(),
            message: e.to_string(),
        })?;
    let build_err = |e: tokenizers::Error| TokenizerError::Build {
        path: path.clone(),
        message: e.to_string(),
    };
    let mut inner = HfTokenizer::new(bpe);
    inner.with_normalizer(Some(Replace::new(" ", "\u{2581}").map_err(build_err)?));
    inner.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(build_err)?,
    ));
    inner.with_decoder(Some(DecoderSequence::new(vec![
        Replace::new("\u{2581}", " ").map_err(build_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    let of_type = |ty: i64| {
        tokens
            .iter()
            .zip(&types)
            .filter(move |(_, &t)| t == ty)
            .map(|(s, _)| s)
    };
    let control: Vec<AddedToken> = of_type(TOKEN_TYPE_CONTROL)
        .map(|s| AddedToken::from(s.clone(), true).normalized(false))
        .collect();
    inner.add_special_tokens(&control);
    let user: Vec<AddedToken> = of_type(TOKEN_TYPE_USER_DEFINED)
        .filter(|s| vocab.contains_key(*s))
        .map(|s| AddedToken::from(s.clone(), false).normalized(false))
        .collect();
    inner.add_tokens(&user);
    Ok((inner, tokens.len()))
}

/// The merges a SentencePiece vocabulary implies, best first: every split of
/// a token into two tokens, ranked by the merged token's position in the
/// file, then the longer left piece first (Hugging Face's `generate_merges`
/// with `-index` as the score).
fn merges_from_vocabulary(
    tokens: &[String],
    vocab: &std::collections::HashMap<String, u32>,
) -> Vec<(String, String)> {
    // (rank of the merged token, left length, right length, left, right)
    let mut merges: Vec<(u32, usize, usize, &str, &str)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in tokens {
        // A respelled duplicate ranks where its last copy sits, once.
        if !seen.insert(t.as_str()) {
            continue;
        }
        let rank = vocab[t];
        let mut local: Vec<(u32, usize, usize, &str, &str)> = t
            .char_indices()
            .skip(1)
            .filter_map(|(i, _)| {
                let (l, r) = t.split_at(i);
                (vocab.contains_key(l) && vocab.contains_key(r))
                    .then(|| (rank, l.chars().count(), r.chars().count(), l, r))
            })
            .collect();
        local.sort_by_key(|m| (vocab[m.3], vocab[m.4]));
        merges.extend(local);
    }
    // Stable: equal keys keep the order above, as Python's sort does.
    merges.sort_by(|a, b| (a.0, b.1, b.2).cmp(&(b.0, a.1, a.2)));
    merges
        .into_iter()
        .map(|m| (m.3.to_string(), m.4.to_string()))
        .collect()
}
