//! The GGUF tokenizer against the Python `tokenizers` library built from the
//! same vocabulary and merges (fixtures/gguf_tokenize.py), and the ChatML
//! template.

mod gguf_python;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use model::gguf::GgufFile;
use model::tokenizer::{ChatTemplate, Tokenizer};

const PROMPTS: &[&str] = &[
    "What is the capital of France?",
    "In 2024, 3.14159 and 1,000,000 (x=42).",
    "naïve café — 東京 🙂 Ünïcödé",
    "  leading spaces, trailing  \n\n\ttabs and\r\nnewlines   ",
    "don't you'll we've I'm",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b <|endoftext|>",
    "",
];

fn python_ids(model: &Path, texts: &[&str], variant: Option<&str>) -> Vec<Vec<u32>> {
    let mut cmd = Command::new(gguf_python::python());
    cmd.arg(gguf_python::repo_root().join("fixtures/gguf_tokenize.py"))
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(variant) = variant {
        cmd.env("TAPTREE_TOKENIZE_VARIANT", variant);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn smollm2_tokenizer() -> Option<(std::path::PathBuf, Tokenizer)> {
    if !gguf_python::python_has(&["gguf", "tokenizers"]) {
        return None;
    }
    let path = gguf_python::smollm2()?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap()
        .unwrap();
    Some((path, tok))
}

#[test]
fn smollm2_ids_match_python_tokenizers() {
    let Some((path, tok)) = smollm2_tokenizer() else {
        return;
    };
    let chat = tok.render_chat("What is the capital of France?").unwrap();
    let mut texts = PROMPTS.to_vec();
    texts.push(&chat);
    let expected = python_ids(&path, &texts, None);
    for (text, want) in texts.iter().zip(&expected) {
        let got = tok.encode(text).unwrap();
        assert_eq!(&got, want, "ids of {text:?}");
        assert_eq!(tok.decode(&got).unwrap(), *text, "round trip of {text:?}");
    }
    // Digits are split one by one (the `smollm` pre-tokenizer).
    assert_eq!(tok.encode("2024").unwrap().len(), 4);
    assert_eq!(
        tok.encode("What is the capital of France?").unwrap(),
        [1780, 314, 260, 3575, 282, 4649, 47]
    );

    // A reference that treats `<|im_start|>` as plain text must not agree.
    let wrong = python_ids(&path, &[PROMPTS[5]], Some("no-special"));
    assert_ne!(tok.encode(PROMPTS[5]).unwrap(), wrong[0]);
}

#[test]
fn smollm2_chat_prompt_is_chatml_with_the_default_system_turn() {
    let Some((_, tok)) = smollm2_tokenizer() else {
        return;
    };
    assert_eq!(
        (tok.bos_id, tok.eos_id, tok.add_bos),
        (Some(1), Some(2), false)
    );
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert!(tok.is_end(2));
    let text = tok.render_chat("What is the capital of France?").unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_chat("What is the capital of France?").unwrap();
    assert_eq!(ids[0], 1, "starts with <|im_start|>");
    assert_eq!(
        ids.iter().filter(|&&i| i == 1).count(),
        3,
        "three turns opened"
    );
    assert_eq!(
        ids.iter().filter(|&&i| i == 2).count(),
        2,
        "two turns closed"
    );
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

#[test]
fn chat_templates_other_than_chatml_are_refused() {
    let llama2 = "{% for message in messages %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}";
    let e = ChatTemplate::parse(llama2).unwrap_err().to_string();
    assert!(e.contains("not ChatML") && e.contains("[INST]"), "{e}");

    // ChatML without a default system turn, with escaped newlines.
    let plain = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let t = ChatTemplate::parse(plain).unwrap();
    assert_eq!(t.default_system, None);
    assert_eq!(
        t.render_user("hi"),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );

    // Qwen-style default system prompt, written with escaped newlines.
    let qwen = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    assert_eq!(
        ChatTemplate::parse(qwen).unwrap().default_system.as_deref(),
        Some("You are Qwen.")
    );
}

/// A tokenizer-only GGUF: the fixtures' byte vocabulary plus a few merges.
fn small_vocab_gguf(dir: &Path, pre: &str) -> std::path::PathBuf {
    use model::gguf::{GgufWriter, Value, ValueType};
    let mut tokens = fixtures::tokens();
    // "Ġ 1" first: it joins a space to a digit only where the pre-tokenizer
    // leaves them in one piece, which is where the four differ.
    let merges = ["Ġ 1", "1 2", "12 3", "Ġ a", "Ġ t", "h e", "Ġt he", "Ġ Ġ"];
    tokens.extend(["Ġ1", "12", "123", "Ġa", "Ġt", "he", "Ġthe", "ĠĠ"].map(String::from));
    let strings = |v: Vec<String>| {
        Value::Array(
            ValueType::String,
            v.into_iter().map(Value::String).collect(),
        )
    };
    let types = (0..tokens.len())
        .map(|i| Value::I32(if i < 3 { 3 } else { 1 }))
        .collect();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", Value::String(pre.into()))
        .meta("tokenizer.ggml.tokens", strings(tokens))
        .meta(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        )
        .meta(
            "tokenizer.ggml.merges",
            strings(merges.map(String::from).to_vec()),
        );
    let path = dir.join(format!("{pre}.gguf"));
    w.write(&path).unwrap();
    path
}

#[test]
fn every_supported_pre_tokenizer_matches_python() {
    if !gguf_python::python_has(&["gguf", "tokenizers"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let texts = [
        "the 123123 at 1234567 and 12",
        "  the\n\n  a\r\n\tthe's they'LL  ",
        "naïve 東京 ١٢٣ 🙂 <|im_start|>the",
    ];
    let mut per_pre = Vec::new();
    for pre in ["smollm", "gpt-2", "llama-bpe", "qwen2"] {
        let path = small_vocab_gguf(dir.path(), pre);
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
            .unwrap()
            .unwrap();
        let want = python_ids(&path, &texts, None);
        let got: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t).unwrap()).collect();
        assert_eq!(got, want, "pre-tokenizer {pre}");
        per_pre.push(got);
    }
    // The four really differ on these texts (so each was exercised).
    assert_ne!(per_pre[0], per_pre[1], "smollm vs gpt-2");
    assert_ne!(per_pre[2], per_pre[3], "llama-bpe vs qwen2");
    assert_ne!(per_pre[1], per_pre[2], "gpt-2 vs llama-bpe");
}
