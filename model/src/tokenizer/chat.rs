use super::error::TokenizerError;

/// A chat template: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`) or
/// Gemma's turns (`<start_of_turn>role\ncontent<end_of_turn>\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The system turn the template inserts when the conversation has none.
    pub default_system: Option<String>,
    /// How the template marks each turn.
    pub turns: TurnFormat,
}

/// How a template marks a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnFormat {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (SmolLM2, Qwen2).
    ChatMl,
    /// `<start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n`.
    Gemma,
}

impl ChatTemplate {
    /// Gemma's turns, no default system turn.
    pub fn gemma() -> ChatTemplate {
        ChatTemplate {
            default_system: None,
            turns: TurnFormat::Gemma,
        }
    }

    /// Recognises a ChatML or Gemma template and extracts its default system
    /// prompt.
    pub fn parse(template: &str) -> Result<ChatTemplate, TokenizerError> {
        if template.contains("<start_of_turn>") && template.contains("<end_of_turn>") {
            return Ok(ChatTemplate::gemma());
        }
        let chatml = template.contains("<|im_start|>")
            && template.contains("<|im_end|>")
            && template.contains("add_generation_prompt")
            && (template.contains("message['role']") || template.contains("message[\"role\"]"));
        if !chatml {
            return Err(TokenizerError::UnsupportedChatTemplate {
                excerpt: template.chars().take(120).collect(),
            });
        }
        // A default system turn is a literal inside a branch taken when the
        // first message is not a system one.
        let has_default_branch = template.contains("!= 'system'")
            || template.contains("!= \"system\"")
            || template.contains("!='system'");
        let default_system = has_default_branch
            .then(|| {
                let start = template.find("<|im_start|>system")? + "<|im_start|>system".len();
                let rest = &template[start..];
                let body = rest
                    .strip_prefix('\n')
                    .or_else(|| rest.strip_prefix("\\n"))?;
                let end = body.find("<|im_end|>")?;
                Some(body[..end].replace("\\n", "\n"))
            })
            .flatten();
        Ok(ChatTemplate {
            default_system,
            turns: TurnFormat::ChatMl,
        })
    }

    /// One user turn, with the default system turn when the template has one,
    /// and the generation prompt (`<|im_start|>assistant\n`).
    pub fn render_user(&self, user: &str) -> String {
        if self.turns == TurnFormat::Gemma {
            // The template's `{{ bos_token }}` is the tokenizer's to add.
            return format!(
                "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
                user.trim()
            );
        }
        let mut s = String::new();
        if let Some(system) = &self.default_system {
            s.push_str(&format!("<|im_start|>system\n{system}<|im_end|>\n"));
        }
        s.push_str(&format!("<|im_start|>user\n{user}<|im_end|>\n"));
        s.push_str("<|im_start|>assistant\n");
        s
    }
}
