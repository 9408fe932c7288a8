"""Named errors for bad input. Every one is a clear refusal, never a silent answer."""

from __future__ import annotations


class ReferenceEngineError(ValueError):
    """Base of every input error the reference engine raises."""


class EmptyPromptError(ReferenceEngineError):
    """A prompt must have at least one token: there is nothing to condition on otherwise."""


class OutOfVocabularyError(ReferenceEngineError):
    """A token id outside [0, vocab_size)."""


class ContextOverflowError(ReferenceEngineError):
    """len(prompt) + max_tokens exceeds the model's context (max_position_embeddings)."""


class BadRequestError(ReferenceEngineError):
    """max_tokens < 1, duplicate request id, or another malformed field."""


class UnknownRevisionError(ReferenceEngineError):
    """No shipped checkpoint has this revision."""


class UnknownAdapterError(ReferenceEngineError):
    """No shipped LoRA adapter has this name."""


class PoolExhaustedError(RuntimeError):
    """A single request needs more KV blocks than the whole pool holds: it can never be scheduled."""


def validate_prompt(prompt, max_tokens: int, vocab_size: int, max_context: int) -> None:
    if len(prompt) == 0:
        raise EmptyPromptError("empty prompt: give at least one token id")
    bad = [t for t in prompt if not (0 <= int(t) < vocab_size)]
    if bad:
        raise OutOfVocabularyError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if int(max_tokens) < 1:
        raise BadRequestError(f"max_tokens must be >= 1, got {max_tokens}")
    if len(prompt) + int(max_tokens) > max_context:
        raise ContextOverflowError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context of {max_context}")
